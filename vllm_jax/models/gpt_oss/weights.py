"""gpt-oss's params by HF tensor name: the float layout transformers' `save_pretrained` writes (the published
checkpoints' MXFP4 experts read in this layout through mxfp4_checkpoint.Mxfp4Checkpoint).

    model.layers.{i}.self_attn.sinks                  [num_heads]   -> layers/sinks
    model.layers.{i}.mlp.router.weight, .bias         [E, H], [E]   -> layers/router [., H, E], router_bias
    model.layers.{i}.mlp.experts.gate_up_proj         [E, H, 2I]    -> layers/experts_gate_up (as stored: [in, out],
                                                                       gate / up interleaved on the columns)
    model.layers.{i}.mlp.experts.gate_up_proj_bias    [E, 2I]       -> layers/experts_gate_up_bias
    model.layers.{i}.mlp.experts.down_proj, _bias     [E, I, H], [E, H]

The attention (with biases), norms, embeddings and LM head are the dense decoder's names.
"""

from __future__ import annotations

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.models.llama.weights import decoder_param_sources
from vllm_jax.models.param_source import ParamSource, per_layer

# our stacked layer param -> (HF suffix under model.layers.{layer}., transpose)
_GPT_OSS_TENSORS: dict[str, tuple[str, bool]] = {
    "sinks": ("self_attn.sinks", False),
    "router": ("mlp.router.weight", True),
    "router_bias": ("mlp.router.bias", False),
    "experts_gate_up": ("mlp.experts.gate_up_proj", False),
    "experts_gate_up_bias": ("mlp.experts.gate_up_proj_bias", False),
    "experts_down": ("mlp.experts.down_proj", False),
    "experts_down_bias": ("mlp.experts.down_proj_bias", False),
}


def gpt_oss_param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param gpt-oss has; the loader uses the entries its param tree contains."""
    sources = decoder_param_sources(spec)
    for name, (suffix, transpose) in _GPT_OSS_TENSORS.items():
        sources[("layers", name)] = per_layer(f"model.layers.{{layer}}.{suffix}", spec.num_layers, transpose)
    return sources
