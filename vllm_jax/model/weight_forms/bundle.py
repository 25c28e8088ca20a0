"""Which form each of a layer's stored linears and expert stacks takes: the one place the model's `Quantization`
picks a weight form's class (docs/architecture/06-model.md, "Weight forms"). The params arrive as the layer loop
slices them: a stacked param's layer (an array), or in the CPU switched scan each layer's own array
(`switched_forms`)."""

from __future__ import annotations

import jax

from vllm_jax.model.grouped_quant import min_name
from vllm_jax.model.quantization import QUANTIZED_LINEARS, Quantization, scale_name
from vllm_jax.model.weight_forms.base import WeightForm
from vllm_jax.model.weight_forms.channel_scaled import ChannelScaledWeight
from vllm_jax.model.weight_forms.dense import DenseWeight, as_weight_form
from vllm_jax.model.weight_forms.experts import ChannelScaledExperts, DenseExperts
from vllm_jax.model.weight_forms.gguf_blocks import GGUFBlocksWeight
from vllm_jax.model.weight_forms.group_scaled import GroupScaledWeight
from vllm_jax.model.weight_forms.layer_switch import LayerSwitch

# The quantized linears read through a WeightForm; the MoE experts' stacks (`experts_*`) through an ExpertStack
# (`bundle_experts`)
LAYER_LINEARS = tuple(sorted(name for name in QUANTIZED_LINEARS if not name.startswith("experts_")))


def quantized_form(name: str, values: WeightForm | jax.Array, scale: jax.Array, minimum: jax.Array | None,
                   quant: Quantization) -> WeightForm:
    """The form of linear `name` stored as `values` with its `_scale` (and `_min`) sibling under `quant`: kept
    GGUF blocks, block-fp8 grouped scales [in // g, out], or one scale per output channel (W8A8 where the
    model's Quantization says so)."""
    fmt = quant.format_of(name) if quant.gguf_kept else None
    if fmt is not None:
        return GGUFBlocksWeight(values, scale, minimum, fmt)
    if quant.group_size is not None:
        return GroupScaledWeight(as_weight_form(values), scale)
    return ChannelScaledWeight(as_weight_form(values), scale, quant.quantize_activations)


def bundle_quantized(w: dict, quant: Quantization | None) -> dict:
    """One layer's weights with each quantized linear and its `_scale` (and `_min`) siblings joined into its
    weight form (the dict unchanged without `quant`). Already switched linears (`switched_forms`: values a
    LayerSwitch) keep the switch as their values."""
    if quant is None:
        return w
    out = dict(w)
    for name in LAYER_LINEARS:
        if scale_name(name) in out:
            out[name] = quantized_form(name, out[name], out.pop(scale_name(name)), out.pop(min_name(name), None),
                                       quant)
    return out


def switched_forms(per_layer: dict[str, tuple], index: jax.Array, quant: Quantization | None) -> dict:
    """name -> LayerSwitch over each layer's form, for the matrices the CPU scan reads per layer (name -> one array
    per layer): kept GGUF blocks switch their values, scale and min together (their siblings are consumed), every
    other matrix as a DenseWeight (a per-channel scale, sliced by the scan, then wraps it: `bundle_quantized`)."""
    kept = dict(quant.formats) if quant is not None and quant.gguf_kept else {}
    out, consumed = {}, set()
    for name, arrays in per_layer.items():
        fmt = kept.get(name)
        if fmt is None or scale_name(name) not in per_layer:
            continue
        minimum = per_layer.get(min_name(name), (None,) * len(arrays))
        out[name] = LayerSwitch(tuple(GGUFBlocksWeight(v, s, m, fmt)
                                      for v, s, m in zip(arrays, per_layer[scale_name(name)], minimum)), index)
        consumed |= {scale_name(name), min_name(name)}
    for name, arrays in per_layer.items():
        if name not in out and name not in consumed:
            out[name] = LayerSwitch(tuple(DenseWeight(a) for a in arrays), index)
    return out


def bundle_experts(w: dict, names: tuple[str, ...], quant: Quantization | None) -> dict:
    """One MoE layer's weights with each expert stack of `names` as its form: with `quant` the int8 / fp8 values
    joined with their `_scale` sibling [E, out] (experts always scale per output channel, weight-only), else the
    plain stack."""
    out = dict(w)
    for name in names:
        out[name] = (DenseExperts(out[name]) if quant is None
                     else ChannelScaledExperts(out[name], out.pop(scale_name(name))))
    return out
