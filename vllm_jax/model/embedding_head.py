"""The embedding table and the LM head in whichever form they are stored: a mixin of DecoderLM.

Three stored forms, fixed when the model is built (model/quantization.py), each a form object the forward calls
(the table's: model/weight_forms/embedding_tables.py; an untied head's: the layers' weight forms):
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
from flax import nnx

from vllm_jax.model.grouped_quant import min_name
from vllm_jax.model.layers import grouped_params, init_param, linear_params
from vllm_jax.model.quantization import EMBEDDING, quantize_table, scale_name
from vllm_jax.model.row_gather import take_rows
from vllm_jax.model.step_inputs import StepInputs, real_logits_rows
from vllm_jax.model.weight_forms.base import WeightForm
from vllm_jax.model.weight_forms.bundle import quantized_form
from vllm_jax.model.weight_forms.dense import DenseWeight
from vllm_jax.model.weight_forms.embedding_tables import DenseTable, EmbeddingTable, GGUFBlocksTable, RowScaledTable
from vllm_jax.native import gguf_matvec

LM_HEAD = "lm_head"
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
        embed_fmt = quant.format_of(EMBEDDING) if quant is not None and quant.gguf_kept else None
        if embed_fmt:
            for name, param in grouped_params(EMBEDDING, shape, embed_fmt, axis=-1).items():
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
        for name, param in linear_params(rngs, LM_HEAD, (spec.hidden_size, spec.vocab_size), dtype,
                                         head_quant).items():
            setattr(self, name, param)

    def _embed(self, ids: jax.Array) -> jax.Array:
        """The embedding rows of `ids`, through the table's form (`_table_form`)."""
        return self._table_form().lookup(ids)

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
        """float32 logits of the normed last states: x @ E^T through the table's form (tied), or x @ lm_head through
        the head's weight form (untied)."""
        if self.spec.tie_word_embeddings:
            return self._table_form().logits(last)
        return self._head_form().matmul(last)

    def _table_form(self) -> EmbeddingTable:
        """The embedding table in its stored form (weight_forms/embedding_tables.py): kept GGUF blocks, online
        int8 / fp8 rows with row scales, or the model dtype. The one place the table's form is picked."""
        quant, platform, dtype = self.quantization, self.kernels.platform, self.final_norm[...].dtype
        sharded = self.kernels.mesh is not None
        fmt = quant.format_of(EMBEDDING) if quant is not None and quant.gguf_kept else None
        if fmt is not None:
            return GGUFBlocksTable(*self._stored_parts(EMBEDDING), fmt, dtype, sharded,
                                   HEAD_CHUNK_ROWS.get(platform))
        if self._table_quantized():
            return RowScaledTable(self.embed_tokens[...], self.embed_tokens_scale[...], dtype, sharded,
                                  HEAD_CHUNK_ROWS.get(platform))
        return DenseTable(self.embed_tokens[...], sharded, FLOAT_HEAD_CHUNK_ROWS.get(platform))

    def _head_form(self) -> WeightForm:
        """The untied LM head [H, V] as the layers' linears are (weight_forms/bundle.py: quantized_form): kept GGUF
        blocks, online int8 / fp8 per output channel, or the model dtype."""
        if not self._head_stored_quantized():
            return DenseWeight(self.lm_head[...])
        return quantized_form(LM_HEAD, *self._stored_parts(LM_HEAD), self.quantization)

    def _untied_head_quantized(self) -> bool:
        """An untied LM head is quantized online (int8 / fp8 values, float32 scales per vocab entry)."""
        return self.quantization is not None and self.quantization.embedding

    def _table_quantized(self) -> bool:
        """Whether the embedding table (and so a tied LM head) is quantized online, which it is except on TPU:
        there XLA's program for Llama-3-8B read ~1.1 GB more per decode step with an int8 table than the gathered
        rows need (the whole table, converted; v6e batch 1: 9.27 GB for 8.17 needed, roofline 5.01 -> 5.65 ms), so
        TPU keeps it in the model dtype (docs/architecture/06-model.md, "Quantized weights")."""
        return self._untied_head_quantized() and self.kernels.platform != "tpu"

    def _head_stored_quantized(self) -> bool:
        """Whether the untied head is stored quantized: kept GGUF blocks (the file keeps it) or online int8 / fp8."""
        quant = self.quantization
        kept = quant is not None and quant.gguf_kept and quant.format_of(LM_HEAD) is not None
        return kept or self._untied_head_quantized()

    def _stored_parts(self, name: str) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """(values, scale, min or None) of quantized param `name`: only Q4_1 / Q4_K blocks have mins."""
        params = vars(self)
        minimum = params.get(min_name(name))
        return params[name][...], params[scale_name(name)][...], None if minimum is None else minimum[...]
