"""The recurrent mixers of hybrid models (docs/architecture/17-state-cache.md): the causal conv, gated DeltaNet
(Qwen3.5, Qwen3-Next) and Mamba2 (Granite 4.0-H), over a step's ragged batch with one state per sequence."""
