"""DecoderSpec: the architecture facts the decoder needs, read once from a transformers config, and the fields every
family reads the same way (`common_spec_fields`). Each family's own reader is in its place under models/
(the dense decoders': models/llama/spec.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vllm_jax.model.rope import rope_inv_freq
from vllm_jax.model.state_cache import StateLayout


@dataclass(frozen=True)
class DecoderSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_windows: tuple[int, ...]  # per layer, 0 = full attention
    inv_freq: tuple[float, ...]  # rotary inverse frequencies (head_dim / 2), scaling applied
    rope_attention_scaling: float  # multiplies cos/sin (1.0 except for YaRN-style scalings)
    # Family switches (keyword-only with defaults, so subclasses such as MoeSpec keep their positional fields):
    # the embedding output times this (Gemma: sqrt(hidden), Granite: embedding_multiplier)
    embedding_multiplier: float = field(default=1.0, kw_only=True)
    # softmax scale of q.k; None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5, Granite:
    # attention_multiplier)
    attention_scale: float | None = field(default=None, kw_only=True)
    # Granite: each residual branch (attention, MLP output) times this before it is added (models/granite/model.py)
    residual_multiplier: float = field(default=1.0, kw_only=True)
    # Granite: the logits divided by this (models/granite/model.py)
    logits_scaling: float = field(default=1.0, kw_only=True)
    # LongRoPE (Phi-3): the long-context inverse frequencies, () when none; model/rope_longrope.py picks them
    long_inv_freq: tuple[float, ...] = field(default=(), kw_only=True)
    # LongRoPE: a context (max_model_len) longer than this uses long_inv_freq for every token (0: no LongRoPE)
    rope_original_max_position: int = field(default=0, kw_only=True)

    def for_context(self, max_model_len: int | None) -> DecoderSpec:
        """The spec an engine serving `max_model_len` tokens runs: with LongRoPE (model/rope_longrope.py), the long
        frequencies for every token when max_model_len exceeds the original context; otherwise (or without a
        length: the short factors, transformers' own choice within the original context) this spec unchanged."""
        if not self.long_inv_freq or max_model_len is None or max_model_len <= self.rope_original_max_position:
            return self
        return dataclasses.replace(self, inv_freq=self.long_inv_freq)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_cache_layers(self) -> int:
        """Layers of the KV cache: one per layer, except where layers share K/V (Gemma 4: Gemma4Spec)."""
        return self.num_layers

    @property
    def kv_cache_heads(self) -> int:
        """Rows per token in the KV cache's head axis: K and V interleaved (MLA: one latent row, MlaSpec)."""
        return 2 * self.num_kv_heads

    @property
    def kv_cache_width(self) -> int:
        """Width of one KV-cache row (docs/architecture/04-kv-cache.md, "KV cache layout")."""
        return self.head_dim

    @property
    def state_layout(self) -> StateLayout | None:
        """A hybrid model's per-sequence recurrent state (model/state_cache.py); None: attention only."""
        return None

    @property
    def sm_scale(self) -> float:
        return self.head_dim ** -0.5 if self.attention_scale is None else self.attention_scale


def pick_architecture(config: Any, supported: tuple[str, ...]) -> str:
    """The first of the config's `architectures` in `supported`; otherwise an error naming the supported ones."""
    architectures = list(getattr(config, "architectures", None) or [])
    arch = next((a for a in architectures if a in supported), None)
    if arch is None:
        raise ValueError(f"unsupported model architecture {architectures or '(none given)'}; "
                         f"supported: {', '.join(supported)}")
    return arch


def common_spec_fields(config: Any, arch: str, check_activation: bool = True,
                       rope: dict | None = None) -> dict[str, Any]:
    """The DecoderSpec fields every Llama-family architecture reads the same way (attention shape, rope,
    norms, windows), checked once. `check_activation`: refuse a `hidden_act` other than silu (a family with
    another FFN, Gemma's GeGLU, checks its own). `rope`: the rope parameters, when the family reads them itself
    (Gemma 3's per layer type); None: `rope_parameters_of(config)`."""
    act = getattr(config, "hidden_act", "silu")
    if check_activation and act not in ("silu", "swish"):
        raise ValueError(f"{arch}: hidden_act {act!r} is not supported (only silu)")
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"{arch}: num_attention_heads ({num_heads}) is not a multiple of "
                         f"num_key_value_heads ({num_kv_heads})")
    inv_freq, scaling = rope_inv_freq(rope if rope is not None else rope_parameters_of(config), head_dim)
    return dict(
        architecture=arch, vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        rms_norm_eps=float(config.rms_norm_eps),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        sliding_windows=_sliding_windows(config), inv_freq=tuple(float(x) for x in inv_freq),
        rope_attention_scaling=scaling)


def _sliding_windows(config: Any) -> tuple[int, ...]:
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or 0
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return tuple(window if t == "sliding_attention" else 0 for t in layer_types)
    if getattr(config, "use_sliding_window", True) is False:
        return (0,) * n
    return (int(window),) * n


def rope_parameters_of(config: Any) -> dict:
    """transformers 5 keeps everything in `rope_parameters`; 4.x used rope_theta + rope_scaling."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    nested = sorted(key for key, value in params.items() if isinstance(value, dict))
    if nested:  # per-layer-type rope (Gemma 3's style): a family must read it itself, not fall back to defaults
        raise ValueError(f"{getattr(config, 'architectures', None)}: rope_parameters per layer type "
                         f"({', '.join(nested)}) are not supported for this architecture")
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None)
    if scaling and "rope_type" not in params:
        params.update(scaling)
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("max_position_embeddings", getattr(config, "max_position_embeddings", None))  # longrope, YaRN
    return params
