"""LoRA inside the forward: `bundle_lora` wrapping one layer's targets in the LoRA weight form
(model/weight_forms/lora.py: `LoRAWeight`, a base weight plus its `LoRAAdapter`, whose delta its `linear` adds),
and `bundle_expert_lora` wrapping a MoE layer's expert stacks in theirs (model/weight_forms/expert_lora.py:
`LoRAExperts`) (docs/architecture/11-lora.md, "LoRA adapters")."""

from __future__ import annotations

import jax

from vllm_jax.model.fused_projections import QKV, QKV_PARTS
from vllm_jax.model.weight_forms.dense import as_weight_form
from vllm_jax.model.weight_forms.expert_lora import LoRAExperts
from vllm_jax.model.weight_forms.lora import LoRAAdapter, LoRAMask, LoRAWeight


def bundle_lora(w: dict, lora: dict | None, mask: LoRAMask | None, layer: jax.Array | int) -> dict:
    """Layer `layer`'s weights with each adapted linear wrapped in a LoRAWeight (unchanged without `lora`).
    `lora`: target name -> (a [L, N, in, R], b [L, N, R, out]), every layer's slots. A target inside a fused
    weight (q_proj in `qkv_proj`: model/fused_projections.py) gets its LoRAAdapter alone under its own name,
    whose delta `layers.fused_linears` adds to that part's output."""
    if not lora:
        return w
    out = dict(w)
    for name, (a, b) in lora.items():
        if name in out:  # a MoE layer's attention half (its experts' stacks: bundle_expert_lora)
            out[name] = LoRAWeight(as_weight_form(out[name]), LoRAAdapter(a, b, mask, layer))
        elif name in QKV_PARTS and QKV in out:
            out[name] = LoRAAdapter(a, b, mask, layer)
    return out


def bundle_expert_lora(w: dict, names: tuple[str, ...], lora: dict | None, mask: LoRAMask | None,
                       layer: jax.Array | int) -> dict:
    """A MoE layer's weights with each expert stack of `names` (already an ExpertStack: bundle.bundle_experts)
    that `lora` adapts wrapped in LoRAExperts, over layer `layer`'s slice (its global index) of the stacked slots
    a [L, N, E, in, R] / b [L, N, E, R, out] (unchanged without `lora`)."""
    if not lora:
        return w
    out = dict(w)
    for name in names:
        if name in lora:
            a, b = lora[name]
            out[name] = LoRAExperts.of(out[name], a, b, layer, mask)
    return out
