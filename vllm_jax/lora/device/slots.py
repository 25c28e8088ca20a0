"""The device side of multi-LoRA: stacked adapter slots of fixed shape, written in place, never recompiled.

Per target module (q/k/v/o, gate/up/down) two arrays, a [L, N, in, R] and b [L, N, R, out], N = max_loras + 1
(slot 0 stays zeros: "no adapter"), R = max_lora_rank, in the model dtype; an adapter's scaling is folded into b
at load (lora/adapter.py). Writing an adapter into a slot is one jitted program over all targets with the stacks
donated (a dynamic-update-slice at a traced slot index), compiled once by warm-up: loading or evicting an adapter
never compiles anything. Under tensor parallelism the slots split like their base layer: a column-parallel target
(its out features on "model") splits b on out and replicates a; a row-parallel one (in features on "model")
splits a on in and replicates b, so x @ a and the product with b need no other collective than the base layer's
(docs/architecture/11-lora.md, "LoRA adapters").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.lora.adapter import LoRAAdapter, TargetShapes
from vllm_jax.lora.config import ATTENTION_TARGETS, SUPPORTED_TARGETS, LoRAConfig
from vllm_jax.model.fused_projections import QKV
from vllm_jax.model.spec import DecoderSpec


def target_shapes(spec: DecoderSpec) -> TargetShapes:
    """(in, out) features of each module an adapter may target, from the model's spec."""
    h, i = spec.hidden_size, spec.intermediate_size
    features = {"q_proj": (h, spec.q_size), "k_proj": (h, spec.kv_size), "v_proj": (h, spec.kv_size),
                "o_proj": (spec.q_size, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    if getattr(spec, "num_experts", None) is not None:  # MoE: attention and the experts, one A/B per expert
        # (docs/architecture/11-lora.md, "Mixture-of-experts models")
        e = spec.intermediate_size  # an expert's FFN width (MoeSpec)
        experts = {"experts_gate": (h, e), "experts_up": (h, e), "experts_down": (e, h)}
        return TargetShapes(spec.num_layers, {name: features[name] for name in ATTENTION_TARGETS} | experts,
                            spec.num_experts)
    return TargetShapes(spec.num_layers, {name: features[name] for name in SUPPORTED_TARGETS})


def _base_axes(params: nnx.State, name: str) -> tuple:
    """The mesh axes of a base weight's (expert,) in and out dims, read off its placed array (stacked or per
    layer; an expert weight is [(L,) E, in, out]); a target fused into another weight (model/fused_projections.py)
    splits like it."""
    layers = params["layers"]
    value = (layers[name] if name in layers else layers[QKV]).get_value()
    array = value[0] if isinstance(value, tuple) else value
    sharding = getattr(array, "sharding", None)
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    spec = spec + (None,) * (len(array.shape) - len(spec))  # a PartitionSpec may leave out trailing dims
    return spec[-3:] if name.startswith("experts_") else spec[-2:]


class LoRASlotArrays:
    """The stacked slots on the device (`arrays`: target -> (a, b)) and their write program."""

    def __init__(self, config: LoRAConfig, shapes: TargetShapes, dtype, mesh: Mesh, params: nnx.State,
                 on_trace: Callable[[], None] = lambda: None, abstract: bool = False):
        self.shapes, self.rank, self.num_slots = shapes, config.max_lora_rank, config.max_loras + 1
        self.dtype, self.on_trace = jnp.dtype(dtype), on_trace
        n, r, layers = self.num_slots, self.rank, shapes.num_layers
        self.shardings: dict[str, tuple[NamedSharding, NamedSharding]] = {}
        arrays = {}
        for name, (fin, fout) in shapes.features.items():
            *expert_axis, in_axis, out_axis = _base_axes(params, name)  # an expert target: [L, N, E, in / R, ...]
            experts = shapes.lead(name)[1:]
            a_sharding = NamedSharding(mesh, PartitionSpec(None, None, *expert_axis, in_axis, None))
            b_sharding = NamedSharding(mesh, PartitionSpec(None, None, *expert_axis, None, out_axis))
            self.shardings[name] = (a_sharding, b_sharding)
            a_shape, b_shape = (layers, n, *experts, fin, r), (layers, n, *experts, r, fout)
            if abstract:
                arrays[name] = (jax.ShapeDtypeStruct(a_shape, self.dtype, sharding=a_sharding),
                                jax.ShapeDtypeStruct(b_shape, self.dtype, sharding=b_sharding))
            else:
                arrays[name] = (jax.device_put(jnp.zeros(a_shape, self.dtype), a_sharding),
                                jax.device_put(jnp.zeros(b_shape, self.dtype), b_sharding))
        self.arrays = arrays
        # slot -> the adapter written into it (host arrays): what waking from sleep writes back (worker/sleep.py)
        self.resident: dict[int, LoRAAdapter] = {}
        self._write = jax.jit(self._write_impl, donate_argnums=(0,), out_shardings=self.shardings)

    def _write_impl(self, arrays: dict, slot: jax.Array, values: dict) -> dict:
        self.on_trace()
        out = {}
        for name, (a, b) in arrays.items():
            va, vb = values[name]
            out[name] = (jax.lax.dynamic_update_slice_in_dim(a, va[:, None].astype(a.dtype), slot, axis=1),
                         jax.lax.dynamic_update_slice_in_dim(b, vb[:, None].astype(b.dtype), slot, axis=1))
        return out

    def host_values(self, adapter: LoRAAdapter | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every target's [L, in, R] / [L, R, out] for one slot: the adapter's, rank zero-padded to R; zeros for
        targets it leaves alone (and for None: an emptied slot)."""
        r = self.rank
        values = {}
        for name, (fin, fout) in self.shapes.features.items():
            lead = self.shapes.lead(name)
            a = np.zeros(lead + (fin, r), self.dtype)
            b = np.zeros(lead + (r, fout), self.dtype)
            if adapter is not None and name in adapter.weights:
                wa, wb = adapter.weights[name]
                a[..., :wa.shape[-1]] = wa
                b[..., :wb.shape[-2], :] = wb
            values[name] = (a, b)
        return values

    def write(self, slot: int, adapter: LoRAAdapter | None) -> None:
        """Put `adapter` (None: zeros) into `slot` in place (the stacks are donated)."""
        if not 0 < slot < self.num_slots:
            raise ValueError(f"LoRA slot {slot} is outside 1..{self.num_slots - 1}")
        self.arrays = self._write(self.arrays, np.int32(slot), self.host_values(adapter))
        if adapter is None:
            self.resident.pop(slot, None)
        else:
            self.resident[slot] = adapter

    @property
    def write_program(self) -> Any:
        """The jitted write, for an ahead-of-time compile (`write_args` are its abstract arguments)."""
        return self._write

    def write_args(self) -> tuple:
        values = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.host_values(None))
        return self.arrays, jax.ShapeDtypeStruct((), jnp.int32), values

    @property
    def abstract(self) -> bool:
        return isinstance(next(iter(self.arrays.values()))[0], jax.ShapeDtypeStruct)

    def warmup(self) -> None:
        """Compile the write program: zeros into slot 1 (empty then anyway)."""
        self.write(1, None)
        jax.block_until_ready(self.arrays)
