"""The MoE experts' stacked weights [E_here, in, out] as forms behind one interface (`ExpertStack`): each does its
own grouped matmul over the (token, expert) rows sorted by expert (`ExpertGroups`), so the expert FFNs (model/
moe.py, models/gpt_oss/experts.py) call it without asking how the experts are stored
(docs/architecture/06-model.md, "Weight forms").

Forms: `DenseExperts` (the model dtype: float checkpoints, and GGUF / MXFP4 experts, dequantized as they load) and
`ChannelScaledExperts` (int8 / fp8 values with one scale per expert and output channel, weight-only on every
platform); the LoRA-wrapped one is weight_forms/expert_lora.py's. `bundle.bundle_experts` picks the form."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ExpertGroups:
    """The T*k (token, expert) assignments sorted by the expert held here (`of`), and the way back (`combine`);
    shared by every grouped expert FFN (model/moe.py's, models/gpt_oss/experts.py's)."""

    order: jax.Array  # [T*k] assignment index of each sorted row
    sizes: jax.Array  # [E_here] int32 rows per local expert (ragged_dot's group_sizes)
    row_expert: jax.Array  # [T*k] local expert of each sorted row (rows of other experts: the last; masked)
    row_token: jax.Array  # [T*k] the token of each sorted row
    held: jax.Array  # [T*k] the assignment's expert is held here

    @staticmethod
    def of(expert_ids: jax.Array, num_here: int, expert_offset: jax.Array | int = 0) -> ExpertGroups:
        local = expert_ids.reshape(-1) - expert_offset
        held = (local >= 0) & (local < num_here)
        group = jnp.where(held, local, num_here)  # assignments for other experts sort last, outside every group
        order = jnp.argsort(group, stable=True)
        sizes = jnp.bincount(group, length=num_here + 1)[:num_here].astype(jnp.int32)
        return ExpertGroups(order, sizes, jnp.minimum(group[order], num_here - 1), order // expert_ids.shape[1],
                            held)

    def combine(self, out: jax.Array, weights: jax.Array) -> jax.Array:
        """Sorted rows [T*k, H] back to (token, slot) order, times their routing weights [T, k] (float32),
        summed over the slots -> float32 [T, H]; assignments to experts not held here add 0."""
        t, k = weights.shape
        inverse = jnp.zeros_like(self.order).at[self.order].set(jnp.arange(t * k, dtype=self.order.dtype))
        out = out[inverse].astype(jnp.float32)
        contrib = jnp.where(self.held[:, None], out * weights.reshape(-1, 1), 0.0)
        return contrib.reshape(t, k, -1).sum(axis=1)


class ExpertStack(abc.ABC):
    """The experts held here, each a matrix [in, out]: rows grouped by expert -> each row times its expert's
    matrix."""

    @property
    @abc.abstractmethod
    def num_experts(self) -> int:
        """The experts held here (under expert parallelism: this device's slab)."""

    @abc.abstractmethod
    def grouped_matmul(self, rows: jax.Array, groups: ExpertGroups) -> jax.Array:
        """float32 [rows, out]: each row (sorted by expert, `groups`) times its expert's matrix."""

    @abc.abstractmethod
    def expert_axis_specs(self, axis: str) -> ExpertStack:
        """This form with a PartitionSpec in place of each array: the expert axis split over mesh axis `axis`
        (shard_map's in_specs under expert parallelism)."""

    def grouped_linear(self, rows: jax.Array, groups: ExpertGroups, bias: jax.Array | None = None) -> jax.Array:
        """`grouped_matmul` (+ the row's expert's bias [E_here, out], added in float32) in the rows' dtype."""
        y = self.grouped_matmul(rows, groups)
        if bias is not None:
            y = y + bias[groups.row_expert].astype(jnp.float32)
        return y.astype(rows.dtype)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DenseExperts(ExpertStack):
    """A plain stack [E_here, in, out] in the model dtype: one `ragged_dot` over the groups."""

    array: jax.Array

    @property
    def num_experts(self) -> int:
        return self.array.shape[0]

    def grouped_matmul(self, rows: jax.Array, groups: ExpertGroups) -> jax.Array:
        return jax.lax.ragged_dot(rows, self.array, groups.sizes, preferred_element_type=jnp.float32)

    def expert_axis_specs(self, axis: str) -> DenseExperts:
        return DenseExperts(P(axis))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ChannelScaledExperts(ExpertStack):
    """int8 / fp8 values [E_here, in, out] with float32 scales [E_here, out] (model/quantization.py): weight-only,
    the values converted to the rows' dtype inside the `ragged_dot`, each row's output scaled by its expert's
    channel scales."""

    values: jax.Array
    scale: jax.Array

    @property
    def num_experts(self) -> int:
        return self.values.shape[0]

    def grouped_matmul(self, rows: jax.Array, groups: ExpertGroups) -> jax.Array:
        y = jax.lax.ragged_dot(rows, self.values.astype(rows.dtype), groups.sizes,
                               preferred_element_type=jnp.float32)
        return y * self.scale[groups.row_expert]

    def expert_axis_specs(self, axis: str) -> ChannelScaledExperts:
        return ChannelScaledExperts(P(axis), P(axis))


def as_expert_stack(experts: ExpertStack | jax.Array) -> ExpertStack:
    """`experts` as a form: a plain stacked array (a family's float experts, a test's) is DenseExperts; every other
    form arrives as its object. The one place the expert FFN meets a bare array."""
    return experts if isinstance(experts, ExpertStack) else DenseExperts(experts)
