"""The MoE block of a `gemma4` GGUF (gemma-4-26B-A4B): its tensor names and config keys, undone to what an HF
Gemma4ForCausalLM checkpoint with `enable_moe_block` holds (docs/architecture/13-gguf.md, "GGUF files of Gemma 4").

What llama.cpp's converter (`Gemma4Model`) writes, and how it maps back. Every tensor is stored as HF has it (HF's
[out, in] / [E, out, in] already is ggml's layout), so the mapping is by name only:

- `router.proj.weight` [E, H] -> `blk.N.ffn_gate_inp.weight`; `router.scale` [H] -> `blk.N.ffn_gate_inp.scale`;
  `router.per_expert_scale` [E] -> `blk.N.ffn_down_exps.scale` (llama.cpp applies it to the experts' outputs).
- `experts.gate_up_proj` [E, 2I, H] (gate rows, then up rows) -> `blk.N.ffn_gate_up_exps.weight`, fused as it
  is; `experts.down_proj` [E, H, I] -> `blk.N.ffn_down_exps.weight`.
- `pre_feedforward_layernorm_2` / `post_feedforward_layernorm_1` / `post_feedforward_layernorm_2` ->
  `pre_ffw_norm_2` / `post_ffw_norm_1` / `post_ffw_norm_2`, stored as they are (no 1 added, as Gemma 4's others).
- Config: `expert_count` (num_experts), `expert_used_count` (top_k_experts), `expert_feed_forward_length`
  (moe_intermediate_size); `feed_forward_length` stays the dense MLP's width beside the block.

Refused by name: separate `ffn_gate_exps` / `ffn_up_exps` (the converter keeps Gemma 4's fused tensor, so such a
file was not written by it), an MoE tensor without `expert_count` (or the reverse), a layer missing one of the
block's tensors (transformers puts the block in every layer), and expert shapes that disagree with the keys.
"""

from __future__ import annotations

from typing import Any

from vllm_jax.models.gguf_family import GgufError, field

ARCH = "gemma4"
# (GGUF stem, kind) -> HF name under model.layers.{i}.
MOE_BLOCK: dict[tuple[str, str], str] = {
    ("ffn_gate_inp", "weight"): "router.proj.weight",
    ("ffn_gate_inp", "scale"): "router.scale",
    ("ffn_down_exps", "scale"): "router.per_expert_scale",
    ("ffn_gate_up_exps", "weight"): "experts.gate_up_proj",
    ("ffn_down_exps", "weight"): "experts.down_proj",
    ("pre_ffw_norm_2", "weight"): "pre_feedforward_layernorm_2.weight",
    ("post_ffw_norm_1", "weight"): "post_feedforward_layernorm_1.weight",
    ("post_ffw_norm_2", "weight"): "post_feedforward_layernorm_2.weight",
}
_SPLIT_EXPERTS = ("ffn_gate_exps", "ffn_up_exps")
MOE_STEMS = frozenset(stem for stem, _ in MOE_BLOCK) | frozenset(_SPLIT_EXPERTS)


def moe_hf_name(gguf_name: str, layer: str, stem: str, kind: str) -> str | None:
    """The HF name of an MoE block tensor `blk.{layer}.{stem}.{kind}`; None when the stem is no MoE stem."""
    if stem in _SPLIT_EXPERTS:
        raise GgufError(f"GGUF tensor {gguf_name}: Gemma 4's experts are one fused ffn_gate_up_exps tensor "
                               "in llama.cpp's converter; separate gate / up expert tensors are not read")
    if stem not in MOE_STEMS:
        return None
    hf = MOE_BLOCK.get((stem, kind))
    if hf is None:
        raise GgufError(f"GGUF tensor {gguf_name} is no tensor of Gemma 4's MoE block")
    return f"model.layers.{layer}.{hf}"


def moe_config(reader: Any, shapes: dict[str, tuple[int, ...]], n: int, hidden: int, path: str) -> dict[str, Any]:
    """Gemma4TextConfig's MoE fields: enable_moe_block with its sizes when `expert_count` is set, checked against
    every layer's tensors (ggml shapes, fastest dim first); {} for a dense file, which must have no MoE tensor."""
    experts = field(reader, f"{ARCH}.expert_count")
    if not experts:
        stray = next((name for name in shapes if name.startswith("blk.") and name.split(".")[2] in MOE_STEMS), None)
        if stray is not None:
            raise GgufError(f"{path}: tensor {stray} belongs to Gemma 4's MoE block, but the metadata has no "
                                   f"{ARCH}.expert_count")
        return {}
    top_k = field(reader, f"{ARCH}.expert_used_count")
    width = field(reader, f"{ARCH}.expert_feed_forward_length")
    for value, key in ((top_k, "expert_used_count"), (width, "expert_feed_forward_length")):
        if not value:
            raise GgufError(f"{path}: GGUF metadata sets {ARCH}.expert_count but lacks {ARCH}.{key}, needed "
                                   "for Gemma 4's MoE block")
    experts, top_k, width = int(experts), int(top_k), int(width)
    want = {"ffn_gate_inp.weight": (hidden, experts), "ffn_gate_inp.scale": (hidden,),
            "ffn_down_exps.scale": (experts,), "ffn_gate_up_exps.weight": (hidden, 2 * width, experts),
            "ffn_down_exps.weight": (width, hidden, experts), "pre_ffw_norm_2.weight": (hidden,),
            "post_ffw_norm_1.weight": (hidden,), "post_ffw_norm_2.weight": (hidden,)}
    for layer in range(n):
        for suffix, shape in want.items():
            name = f"blk.{layer}.{suffix}"
            if name not in shapes:
                raise GgufError(f"{path}: GGUF lacks tensor {name}: {ARCH}.expert_count is set, so every "
                                       "layer has Gemma 4's MoE block")
            if shapes[name] != shape:
                raise GgufError(f"{path}: tensor {name} has shape {shapes[name]} (ggml order), but "
                                       f"expert_count {experts}, expert_feed_forward_length {width} and the hidden "
                                       f"size {hidden} give {shape}")
    return {"enable_moe_block": True, "num_experts": experts, "top_k_experts": top_k,
            "moe_intermediate_size": width}
