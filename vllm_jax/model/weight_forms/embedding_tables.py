"""The embedding table [V, H] in its stored forms behind one interface (`EmbeddingTable`): `lookup(ids)` gathers and
dequantizes the tokens' rows, `logits(x)` is x @ E^T (the tied LM head). model/embedding_head.py picks the form
once per call from the model's Quantization and platform (docs/architecture/06-model.md, "Weight forms").

Each form gathers through row_gather.take_rows (`sharded`: the table split over a mesh) and dots in row chunks of
`chunk_rows` where the platform wants them (quantized_dots: so no program holds the whole table dequantized)."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from vllm_jax.model.grouped_quant import dequantize_grouped
from vllm_jax.model.quantized_dots import float_dot_rows, float_head_chunk_rows, gguf_dot_rows, quantized_dot_rows
from vllm_jax.model.row_gather import take_rows


class EmbeddingTable(abc.ABC):
    """An embedding table [V, H] in some stored form."""

    @abc.abstractmethod
    def lookup(self, ids: jax.Array) -> jax.Array:
        """[T, H] the rows of `ids` in the model dtype."""

    @abc.abstractmethod
    def logits(self, x: jax.Array) -> jax.Array:
        """float32 x @ E^T [S, V] of the normed last states x [S, H] (the tied LM head)."""


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DenseTable(EmbeddingTable):
    """The table in the model dtype; its tied head read in place by the native kernel on CPU at a few rows, else in
    row chunks of `chunk_rows` where quantized_dots.float_head_chunk_rows finds that faster (None: whole)."""

    table: jax.Array
    sharded: bool = field(metadata={"static": True})
    chunk_rows: int | None = field(metadata={"static": True})

    def lookup(self, ids: jax.Array) -> jax.Array:
        return take_rows(self.table, ids, sharded=self.sharded)

    def logits(self, x: jax.Array) -> jax.Array:
        return float_dot_rows(x, self.table, self._head_chunk_rows)

    def _head_chunk_rows(self) -> int | None:
        if self.chunk_rows is None:
            return None
        return float_head_chunk_rows(*self.table.shape, jnp.dtype(self.table.dtype).name, self.chunk_rows)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class RowScaledTable(EmbeddingTable):
    """Online int8 / fp8 values [V, H] with one float32 scale per vocab row [V, 1] (model/quantization.py:
    quantize_table); the head's values converted inside the dot, scaled per vocab entry."""

    values: jax.Array
    scale: jax.Array
    dtype: jnp.dtype = field(metadata={"static": True})
    sharded: bool = field(metadata={"static": True})
    chunk_rows: int | None = field(metadata={"static": True})

    def lookup(self, ids: jax.Array) -> jax.Array:
        rows = take_rows(self.values, ids, sharded=self.sharded).astype(jnp.float32)
        return (rows * take_rows(self.scale, ids, sharded=self.sharded)).astype(self.dtype)

    def logits(self, x: jax.Array) -> jax.Array:
        return quantized_dot_rows(x, self.values, self.scale, self.chunk_rows)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class GGUFBlocksTable(EmbeddingTable):
    """A table kept in a GGUF file's blocks of format `fmt`, grouped along H (model/grouped_quant.py): the gathered
    rows' values, scales (and mins) dequantized; the head dequantized inside the dot."""

    values: jax.Array
    scale: jax.Array
    minimum: jax.Array | None
    fmt: str = field(metadata={"static": True})
    dtype: jnp.dtype = field(metadata={"static": True})
    sharded: bool = field(metadata={"static": True})
    chunk_rows: int | None = field(metadata={"static": True})

    def lookup(self, ids: jax.Array) -> jax.Array:
        parts = (None if part is None else take_rows(part, ids, sharded=self.sharded)
                 for part in (self.values, self.scale, self.minimum))
        return dequantize_grouped(*parts, self.fmt, axis=-1).astype(self.dtype)

    def logits(self, x: jax.Array) -> jax.Array:
        return gguf_dot_rows(x, self.values, self.scale, self.minimum, self.fmt, self.chunk_rows)
