"""Pooling (vLLM's `--runner pooling`), one feature in one place (docs/architecture/14-pooling.md).

Host side, no jax: the pooler config and its resolution (`config`), the engine's admission of pooling requests
(`requests`) and the offline API (`offline`: `LLM.encode` / `embed` / `classify` / `score`). `pooling/device/` is
the jax side: the poolers, the pooling programs attached to the device step, and the pooling runner. The HTTP
routes stay in server/serving_pooling.py: they are only request parsing and response shapes."""
