"""Gemma4Spec: the facts the Gemma 4 text decoder needs beyond DecoderSpec, read from a transformers
Gemma4TextConfig (docs/architecture/12-families.md, "Gemma 4").

What differs from Gemma 3, as transformers' Gemma4Text* modeling code does it:

- RMSNorm scales by `weight` (not 1 + weight), in float32; V gets a norm without scale; no query_pre_attn_scalar
  (softmax scale 1.0: the q/k norms set the logits' size); no attention soft cap;
- per layer type head shapes: full-attention layers have `global_head_dim` and maybe `num_global_key_value_heads`
  (transformers' `per_layer_config`); with `attention_k_eq_v` a full layer has no v_proj: V is k_proj's output
  (before k_norm and rope);
- full layers' rope is "proportional": the first `partial_rotary_factor` of the frequencies rotate, the rest have
  frequency 0 (cos 1, sin 0: unrotated), over the whole global head_dim;
- KV sharing: the last `num_kv_shared_layers` layers compute no K/V and read the cache of the last non-shared layer
  of their type; they own no cache layer (`cache_layer_of`), and with `use_double_wide_mlp` their MLP is twice
  as wide;
- per-layer-input embeddings (PLE, `ple_size` > 0) and a `layer_scalar` per layer (models/gemma4/model.py);
- with `enable_moe_block` (gemma-4-26B-A4B), routed GeGLU experts beside every layer's MLP (models/gemma4/moe_block.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_jax.model.rope import rope_inv_freq
from vllm_jax.model.spec import DecoderSpec, pick_architecture

GEMMA4_ARCHITECTURES = ("Gemma4ForCausalLM",)
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")
_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class Gemma4Spec(DecoderSpec):
    # per layer: its head_dim (full layers: global_head_dim)
    layer_head_dims: tuple[int, ...] = field(default=(), kw_only=True)
    # per layer: its KV heads (full layers: num_global_key_value_heads when set)
    layer_kv_heads: tuple[int, ...] = field(default=(), kw_only=True)
    # per layer: the layer whose K/V it attends (itself, or a KV-shared layer's producer)
    kv_source: tuple[int, ...] = field(default=(), kw_only=True)
    # per layer: its MLP width (double on KV-shared layers with use_double_wide_mlp)
    layer_intermediate: tuple[int, ...] = field(default=(), kw_only=True)
    # full layers have no v_proj: V is k_proj's output (attention_k_eq_v)
    k_eq_v: bool = field(default=False, kw_only=True)
    # rotary inverse frequencies of the full-attention layers (global_head_dim / 2; zeros past the rotated part)
    global_inv_freq: tuple[float, ...] = field(default=(), kw_only=True)
    # per-layer-input embedding width (hidden_size_per_layer_input); 0: no PLE
    ple_size: int = field(default=0, kw_only=True)
    # rows of the per-layer-input embedding table (vocab_size_per_layer_input)
    ple_vocab_size: int = field(default=0, kw_only=True)
    # cap * tanh(logit / cap) on the final logits; None: no cap
    final_soft_cap: float | None = field(default=None, kw_only=True)
    # the MoE block beside every layer's MLP (enable_moe_block; models/gemma4/moe_block.py): routed experts; None: no
    # block (the runner reads `num_experts` for expert parallelism and LoRA's refusal, as for the MoE families)
    num_experts: int | None = field(default=None, kw_only=True)
    num_experts_per_tok: int = field(default=0, kw_only=True)  # top_k_experts
    moe_intermediate_size: int = field(default=0, kw_only=True)  # one expert's FFN width

    def is_full(self, layer: int) -> bool:
        return self.sliding_windows[layer] == 0

    def is_shared(self, layer: int) -> bool:
        return self.kv_source[layer] != layer

    def group_of(self, layer: int) -> str:
        """The name of the layer's param group: layers of one group have the same shapes and are stacked."""
        return ("full" if self.is_full(layer) else "sliding") + ("_shared" if self.is_shared(layer) else "")

    @property
    def producers(self) -> tuple[int, ...]:
        """The layers that compute and cache K/V, in order: cache layer i belongs to producers[i]."""
        return tuple(i for i in range(self.num_layers) if not self.is_shared(i))

    def cache_layer_of(self, layer: int) -> int:
        return self.producers.index(self.kv_source[layer])

    @property
    def num_cache_layers(self) -> int:
        return len(self.producers)

    @property
    def kv_cache_width(self) -> int:
        """The widest producing head_dim: a narrower layer's K/V are zero-padded to it
        (docs/architecture/12-families.md, "Gemma 4")."""
        return max(self.layer_head_dims[i] for i in self.producers)

    @property
    def kv_cache_heads(self) -> int:
        """Rows per token: K/V pairs of the producing layer with the most KV heads; others repeat theirs."""
        return max(2 * self.layer_kv_heads[i] for i in self.producers)


def gemma4_spec_from_hf_config(config: Any) -> Gemma4Spec:
    arch = pick_architecture(config, GEMMA4_ARCHITECTURES)
    act = getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh"
    if act not in _GELU_TANH:
        raise ValueError(f"{arch}: hidden_activation {act!r} is not supported (only gelu_pytorch_tanh)")
    if getattr(config, "use_bidirectional_attention", None):
        raise ValueError(f"{arch}: use_bidirectional_attention is not supported (causal decoding only)")
    if getattr(config, "attention_bias", False):
        raise ValueError(f"{arch}: attention_bias is not supported (no Gemma 4 checkpoint has it)")
    n = config.num_hidden_layers
    types = list(config.layer_types)
    if any(t not in _TYPES for t in types):
        raise ValueError(f"{arch}: layer_types must be sliding_attention / full_attention; got {sorted(set(types))}")
    per_layer = [config.per_layer_config[i] for i in range(n)]
    head_dims = tuple(int(c.head_dim) for c in per_layer)
    kv_heads = tuple(int(c.num_key_value_heads) for c in per_layer)
    num_heads = config.num_attention_heads
    for i in range(n):
        if num_heads % kv_heads[i]:
            raise ValueError(f"{arch}: layer {i}: num_attention_heads ({num_heads}) is not a multiple of its "
                             f"{kv_heads[i]} KV heads")
    source = _kv_sources(config, types)
    shared = [source[i] != i for i in range(n)]
    wide = bool(getattr(config, "use_double_wide_mlp", False))
    intermediate = tuple(config.intermediate_size * (2 if wide and shared[i] else 1) for i in range(n))
    rope = config.rope_parameters
    sliding = next((i for i in range(n) if types[i] == "sliding_attention"), 0)  # config.head_dim is per layer
    sliding_dim = head_dims[sliding]
    full_dim = next((head_dims[i] for i in range(n) if types[i] == "full_attention"), sliding_dim)
    local_inv_freq = _inv_freq(rope.get("sliding_attention"), sliding_dim, arch) if "sliding_attention" in types \
        else ()
    global_inv_freq = _inv_freq(rope.get("full_attention"), full_dim, arch)
    window = int(getattr(config, "sliding_window", 0) or 0)
    ple = int(getattr(config, "hidden_size_per_layer_input", 0) or 0)
    final_cap = getattr(config, "final_logit_softcapping", None)
    spec = Gemma4Spec(
        architecture=arch, vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_layers=n, num_heads=num_heads,
        num_kv_heads=kv_heads[sliding], head_dim=sliding_dim, rms_norm_eps=float(config.rms_norm_eps),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)), qkv_bias=False, o_bias=False,
        mlp_bias=False, qk_norm=True, sliding_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        inv_freq=local_inv_freq or global_inv_freq, rope_attention_scaling=1.0,
        embedding_multiplier=float(config.hidden_size) ** 0.5, attention_scale=1.0,
        layer_head_dims=head_dims, layer_kv_heads=kv_heads, kv_source=source, layer_intermediate=intermediate,
        k_eq_v=bool(getattr(config, "attention_k_eq_v", False)), global_inv_freq=global_inv_freq, ple_size=ple,
        ple_vocab_size=int(getattr(config, "vocab_size_per_layer_input", 0) or 0) if ple else 0,
        final_soft_cap=float(final_cap) if final_cap else None, **_moe_fields(config, arch))
    _check_groups(spec)
    _check_cache_views(spec)
    return spec


def _moe_fields(config: Any, arch: str) -> dict[str, Any]:
    """The MoE block's sizes when enable_moe_block is set (every layer then has one), else none."""
    if not getattr(config, "enable_moe_block", False):
        return {}
    experts, top_k = config.num_experts, config.top_k_experts
    width = config.moe_intermediate_size
    if not experts or not width or not top_k or not 1 <= top_k <= experts:
        raise ValueError(f"{arch}: enable_moe_block needs num_experts, moe_intermediate_size and top_k_experts "
                         f"between 1 and num_experts; got {experts}, {width}, {top_k}")
    return {"num_experts": int(experts), "num_experts_per_tok": int(top_k), "moe_intermediate_size": int(width)}


def _kv_sources(config: Any, types: list[str]) -> tuple[int, ...]:
    """Per layer, the layer whose K/V it attends: transformers' kv_sharing_modes ('reuse' layers read the last
    layer of their type before the first shared one)."""
    n, num_shared = config.num_hidden_layers, int(getattr(config, "num_kv_shared_layers", 0) or 0)
    first_shared = n - num_shared
    if num_shared and first_shared <= 0:
        raise ValueError(f"{config.architectures}: num_kv_shared_layers ({num_shared}) leaves no layer computing K/V")
    out = []
    for i, t in enumerate(types):
        if i < first_shared:
            out.append(i)
            continue
        producers = [j for j in range(first_shared) if types[j] == t]
        if not producers:
            raise ValueError(f"{config.architectures}: KV-shared layer {i} ({t}) has no earlier {t} layer to read")
        out.append(producers[-1])
    return tuple(out)


def _inv_freq(rope: dict | None, head_dim: int, arch: str) -> tuple[float, ...]:
    """A layer type's rotary inverse frequencies as transformers computes them (float32); 'proportional': the
    rotated angles over the whole head_dim, zeros after them, divided by `factor`."""
    if not rope or "rope_theta" not in rope:
        raise ValueError(f"{arch}: rope_parameters per layer type need a rope_theta; got {rope!r}")
    rope = dict(rope)
    rope_type = rope.setdefault("rope_type", rope.get("type", "default"))
    if rope_type != "proportional":
        inv_freq, scaling = rope_inv_freq(rope, head_dim)
        if scaling != 1.0 or len(inv_freq) != head_dim // 2:
            raise ValueError(f"{arch}: rope_type {rope_type!r} with these parameters is not supported for Gemma 4")
        return tuple(float(x) for x in inv_freq)
    angles = int(float(rope.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    exponents = np.arange(0, 2 * angles, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    rotated = np.float32(1.0) / (np.float32(rope["rope_theta"]) ** exponents)
    inv_freq = np.concatenate([rotated, np.zeros(head_dim // 2 - angles, np.float32)]).astype(np.float32)
    return tuple(float(x) for x in inv_freq / np.float32(rope.get("factor", 1.0)))


def _check_groups(spec: Gemma4Spec) -> None:
    """The layers of one param group (models/gemma4/model.py stacks them) must share head shapes and MLP width."""
    seen: dict[str, tuple] = {}
    for i in range(spec.num_layers):
        shape = (spec.layer_head_dims[i], spec.layer_kv_heads[i], spec.layer_intermediate[i])
        if seen.setdefault(spec.group_of(i), shape) != shape:
            raise ValueError(f"{spec.architecture}: layer {i}'s head_dim / KV heads / MLP width {shape} differ from "
                             f"other {spec.group_of(i)} layers' {seen[spec.group_of(i)]}")


def _check_cache_views(spec: Gemma4Spec) -> None:
    """Each producing layer's KV heads must repeat a whole number of times into the cache's heads, and the query
    heads group evenly over them."""
    heads = spec.kv_cache_heads // 2
    for i in spec.producers:
        h = spec.layer_kv_heads[i]
        if heads % h or spec.num_heads % heads:
            raise ValueError(f"{spec.architecture}: layer {i}'s {h} KV heads do not fit the KV cache's {heads} "
                             f"KV heads per token ({spec.num_heads} query heads; "
                             'docs/architecture/12-families.md, "Gemma 4")')
