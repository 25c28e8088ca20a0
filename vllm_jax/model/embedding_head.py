"""The embedding table and the LM head in whichever form they are stored: a mixin of DecoderLM.

Three stored forms, fixed when the model is built (model/quantization.py):
- the model dtype (no --quantization, a pre-quantized checkpoint, or the table on TPU);
- GGUF blocks kept as the file holds them (--quantization gguf): `embed_tokens` / `lm_head` values with their
  `_scale` (and `_min`) siblings, grouped along hidden (docs/architecture/06-model.md, "Quantized weights");
- online int8 / fp8 (--quantization int8 | fp8 of a float checkpoint): the table with one float32 scale per vocab
  row (`embed_tokens_scale` [V, 1]), an untied head per output channel (`lm_head_scale` [V]).

A mixin rather than a submodule: the params stay attributes of the model itself, so their paths (`embed_tokens`,
`embed_tokens_scale`, `lm_head`, ...) are the ones the weight loaders, the partition rules, LoRA, the EAGLE-3
head's shared embedding and checkpoints address. The host class sets `spec`, `quantization` and `kernels` before
`_init_embedding`, and owns `final_norm`, whose dtype is the model's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.grouped_quant import dequantize_grouped, min_name
from vllm_jax.model.layers import grouped_params, init_param, linear_params, matmul_f32
from vllm_jax.model.quantization import quantize_table, scale_name
from vllm_jax.model.quantized_dots import (
    float_dot_rows,
    float_head_chunk_rows,
    gguf_dot,
    gguf_dot_rows,
    quantized_dot_rows,
)
from vllm_jax.model.row_gather import take_rows
from vllm_jax.model.step_inputs import StepInputs, real_logits_rows
from vllm_jax.model.weight_forms.channel_scaled import ChannelScaledWeight
from vllm_jax.model.weight_forms.dense import DenseWeight
from vllm_jax.native import gguf_matvec

# A kept (or online-quantized) tied LM head's vocab rows per chunk (quantized_dots.gguf_dot_rows and
# quantized_dot_rows): on CPU so the dequantized chunk stays in cache; on GPU / TPU so no program holds the whole
# table dequantized (the default model's kept head was a 54 MiB bfloat16 temporary on H100;
# docs/architecture/06-model.md, "Quantized weights")
HEAD_CHUNK_ROWS = {"cpu": 1024, "gpu": 8192, "tpu": 8192}
# A float tied head's: on CPU only, where quantized_dots.float_head_chunk_rows finds it faster on this machine
# (some CPUs' dots pack the whole transposed table first); accelerators read it in place
FLOAT_HEAD_CHUNK_ROWS = {"cpu": 1024}


class EmbeddingHead:
    """`_embed(ids)` -> the rows of the embedding [T, hidden]; `_lm_head(last)` -> float32 logits [S, vocab]; and
    the params behind them (`_init_embedding`, `_init_lm_head`)."""

    def _init_embedding(self, dtype, rngs: nnx.Rngs) -> None:
        """`embed_tokens` [V, H]: kept GGUF blocks (grouped along hidden), online-quantized values with float32 row
        scales, or the model dtype."""
        spec, quant = self.spec, self.quantization
        shape = (spec.vocab_size, spec.hidden_size)
        embed_fmt = self._kept_format("embed_tokens")
        if embed_fmt:
            for name, param in grouped_params("embed_tokens", shape, embed_fmt, axis=-1).items():
                setattr(self, name, param)
        elif self._table_quantized():
            values, scale = quantize_table(init_param(rngs, shape, dtype).get_value(), quant.scheme)
            self.embed_tokens, self.embed_tokens_scale = nnx.Param(values), nnx.Param(scale)
        else:
            self.embed_tokens = init_param(rngs, shape, dtype)

    def _init_lm_head(self, dtype, rngs: nnx.Rngs) -> None:
        """`lm_head` [H, V] unless the head is the tied table: kept GGUF blocks, quantized per output channel, or
        the model dtype."""
        spec, quant = self.spec, self.quantization
        if spec.tie_word_embeddings:
            return
        head_quant = quant if quant is not None and (quant.gguf_kept or self._untied_head_quantized()) else None
        for name, param in linear_params(rngs, "lm_head", (spec.hidden_size, spec.vocab_size), dtype,
                                         head_quant).items():
            setattr(self, name, param)

    def _embed(self, ids: jax.Array) -> jax.Array:
        """The embedding rows of `ids`; kept GGUF blocks (or online-quantized rows) gather their rows' values and
        scales, then dequantize."""
        if self._table_quantized():
            values, scale = self._rows(self.embed_tokens[...], ids), self._rows(self.embed_tokens_scale[...], ids)
            rows = values.astype(jnp.float32) * scale
            return rows.astype(self.final_norm[...].dtype)
        embed_fmt = self._kept_format("embed_tokens")
        if embed_fmt is None:
            return self._rows(self.embed_tokens[...], ids)
        rows = dequantize_grouped(*(None if part is None else self._rows(part, ids)
                                    for part in self._kept_parts("embed_tokens")), embed_fmt, axis=-1)
        return rows.astype(self.final_norm[...].dtype)

    def _rows(self, table: jax.Array, ids: jax.Array) -> jax.Array:
        """table[ids] (model/row_gather.py: a TPU program's gathers as a loop over chunks)."""
        return take_rows(table, ids, sharded=self.kernels.mesh is not None)

    def _logits_rows(self, hidden: jax.Array, inputs: StepInputs) -> jax.Array:
        """[S, hidden]: the states of the rows that get logits, the bucket's last scheduled token of each row."""
        return self._rows(hidden, inputs.logits_indices)

    def _logits(self, last: jax.Array, inputs: StepInputs) -> jax.Array:
        """float32 logits [S, vocab] of the step's normed last states `last` [S, hidden]: `_lm_head`, told which of
        the S rows are the bucket's padding (CPU's native kept-block dots leave those rows zero)."""
        with gguf_matvec.padded_rows(last.shape[0], real_logits_rows(inputs.logits_indices),
                                     sharded=self.kernels.mesh is not None):
            return self._lm_head(last)

    def _lm_head(self, last: jax.Array) -> jax.Array:
        """float32 logits of the normed last states: x @ E^T (tied) or x @ lm_head, kept GGUF blocks dequantized
        inside the dot (groups along hidden, the contracted dim, either way); online-quantized ones scaled per
        vocab entry (a tied table's values converted inside the dot: `quantized_dot_rows`); a float tied table read
        in place by the native kernel on CPU at a few rows, else in row chunks where that is faster
        (`float_dot_rows`)."""
        chunk_rows = HEAD_CHUNK_ROWS.get(self.kernels.platform)
        if not self.spec.tie_word_embeddings:
            if self._untied_head_quantized():  # [H, V] per output channel, like the layers' linears
                head = ChannelScaledWeight(DenseWeight(self.lm_head[...]), self.lm_head_scale[...],
                                           self.quantization.quantize_activations)
                return matmul_f32(last, head)
            head_fmt = self._kept_format("lm_head")
            if head_fmt is None:
                return matmul_f32(last, self.lm_head[...])
            return gguf_dot(last, *self._kept_parts("lm_head"), head_fmt)
        embed_fmt = self._kept_format("embed_tokens")
        if embed_fmt is None:
            if self._table_quantized():
                return quantized_dot_rows(last, self.embed_tokens[...], self.embed_tokens_scale[...], chunk_rows)
            return float_dot_rows(last, self.embed_tokens[...], self._float_head_chunk_rows)
        return gguf_dot_rows(last, *self._kept_parts("embed_tokens"), embed_fmt, chunk_rows)

    def _float_head_chunk_rows(self) -> int | None:
        chunk_rows = FLOAT_HEAD_CHUNK_ROWS.get(self.kernels.platform)
        if chunk_rows is None:
            return None
        table = self.embed_tokens[...]
        return float_head_chunk_rows(*table.shape, jnp.dtype(table.dtype).name, chunk_rows)

    def _untied_head_quantized(self) -> bool:
        """An untied LM head is quantized online (int8 / fp8 values, float32 scales per vocab entry)."""
        return self.quantization is not None and self.quantization.embedding

    def _table_quantized(self) -> bool:
        """Whether the embedding table (and so a tied LM head) is quantized online, which it is except on TPU:
        there XLA's program for Llama-3-8B read ~1.1 GB more per decode step with an int8 table than the gathered
        rows need (the whole table, converted; v6e batch 1: 9.27 GB for 8.17 needed, roofline 5.01 -> 5.65 ms), so
        TPU keeps it in the model dtype (docs/architecture/06-model.md, "Quantized weights")."""
        return self._untied_head_quantized() and self.kernels.platform != "tpu"

    def _kept_format(self, name: str) -> str | None:
        """The GGUF format `name` is kept in (--quantization gguf), else None."""
        quant = self.quantization
        return quant.format_of(name) if quant is not None and quant.gguf_kept else None

    def _kept_parts(self, name: str) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """(values, scale, min or None) of a param kept in GGUF blocks."""
        minimum = getattr(self, min_name(name), None)
        return (getattr(self, name)[...], getattr(self, scale_name(name))[...],
                None if minimum is None else minimum[...])
