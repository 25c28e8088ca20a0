"""Gemma 2 / Gemma 3 (text) params by HF tensor name: the dense decoder's map (Gemma's `post_attention_layernorm`
normalizes the attention output, which is what our `post_attention_norm` is in models/gemma/model.py) plus the two
feed-forward norms. The MLP has no biases; the LM head is usually tied (no `lm_head.weight` in the file)."""

from __future__ import annotations

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.models.llama.weights import decoder_param_sources
from vllm_jax.models.param_source import ParamSource, per_layer


def gemma_param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param the Gemma model may have; the loader uses the entries its param tree contains."""
    sources = decoder_param_sources(spec)
    for name, hf_name in (("pre_feedforward_norm", "pre_feedforward_layernorm"),
                          ("post_feedforward_norm", "post_feedforward_layernorm")):
        sources[("layers", name)] = per_layer(f"model.layers.{{layer}}.{hf_name}.weight", spec.num_layers)
    return sources
