"""EAGLE-3's auxiliary hidden states from the target models against transformers' `output_hidden_states`.

vLLM collects the residual stream entering layer i (`hidden_states + residual` before layer i runs), which is
transformers' `hidden_states[i]` (index 0: the embedding output). Every layer form (stacked scan, switched scan,
unrolled loop) and the MoE model's per-run scans must give the same states for every token of a ragged batch
computed over two chunked steps.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from tests.helpers.parity import BLOCK_SIZE, MAX_BLOCKS, SPLITS, ragged_sequences
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.model.aux_hidden import check_aux_layers, eagle3_default_layers
from vllm_jax.model.decoder import forward
from vllm_jax.model.layers import unstack_layers
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
from vllm_jax.worker.batch import RowChunk, pack_step_inputs

NUM_TOKENS_PADDED = 32


def _load(path, layers: str, aux_layers: tuple[int, ...]):
    """(spec, params, jitted forward, zeroed KV cache) with `aux_hidden_layers` set before the split."""
    source = resolve_model_source(str(path))
    entry, spec = resolve_architecture(load_hf_config(source))
    model = build_model(entry, spec, "float32", source)
    model.scan_layers = layers != "unrolled"
    model.aux_hidden_layers = aux_layers
    graphdef, params = nnx.split(model)
    if layers != "stacked":
        unstack_layers(params)
    kv = jnp.zeros((spec.num_layers, 64, BLOCK_SIZE, 2 * spec.num_kv_heads, spec.head_dim), jnp.float32)
    return spec, params, jax.jit(partial(forward, graphdef), donate_argnums=1), kv


def _assert_aux_matches(hf, path, layers: str, aux_layers: tuple[int, ...]) -> None:
    """Two chunked steps over four ragged sequences: each computed token's aux row equals transformers' hidden
    states at `aux_layers`, concatenated in layer order, within 1e-4."""
    spec, params, run, kv = _load(path, layers, aux_layers)
    seqs = ragged_sequences()
    blocks, next_block = [], 1
    for s in seqs:
        n = -(-len(s) // BLOCK_SIZE)
        blocks.append(list(range(next_block, next_block + n)))
        next_block += n
    got = [[] for _ in seqs]
    for step in range(2):
        rows = [RowChunk(s[:c] if step == 0 else s[c:], 0 if step == 0 else c, b)
                for s, c, b in zip(seqs, SPLITS, blocks)]
        inputs = pack_step_inputs(rows, block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS,
                                  num_tokens_padded=NUM_TOKENS_PADDED, num_seqs_padded=8)
        kv, _, aux = run(params, kv, inputs)
        assert aux.shape == (NUM_TOKENS_PADDED, len(aux_layers) * spec.hidden_size) and aux.dtype == jnp.float32
        aux = np.asarray(aux)
        for i, start in enumerate(inputs.query_start_loc[:len(seqs)]):
            got[i].append(aux[start:start + len(rows[i].token_ids)])
    for seq, rows in zip(seqs, got):
        with torch.no_grad():
            states = hf(torch.tensor([seq]), output_hidden_states=True).hidden_states
        ref = np.concatenate([states[i][0].numpy() for i in aux_layers], axis=-1)
        np.testing.assert_allclose(np.concatenate(rows), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layers", ["stacked", "switched", "unrolled"])
def test_llama_aux_hidden_states_match_transformers_at_vllms_default_layers(layers, tmp_path):
    hf = make_tiny_checkpoint("llama", tmp_path, num_hidden_layers=8)
    aux_layers = eagle3_default_layers(8)
    assert aux_layers == (2, 4, 5)
    _assert_aux_matches(hf, tmp_path, layers, aux_layers)


@pytest.mark.parametrize("layers", ["stacked", "unrolled"])
def test_moe_aux_hidden_states_match_transformers_across_its_layer_runs(layers, tmp_path):
    """Qwen3-MoE with a dense layer between MoE layers runs one scan per run of same-kind layers: the states
    of layer 0 (the embeddings), of the dense layer and of the MoE layer after it."""
    hf = make_tiny_checkpoint("qwen3_moe_mixed", tmp_path)
    _assert_aux_matches(hf, tmp_path, layers, (0, 1, 2))


def test_off_by_default_returns_kv_and_logits_only(tmp_path):
    make_tiny_checkpoint("llama", tmp_path)
    _, params, run, kv = _load(tmp_path, "stacked", ())
    inputs = pack_step_inputs([RowChunk([5, 6, 7], 0, [1])], block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS,
                              num_tokens_padded=8, num_seqs_padded=8)
    assert len(run(params, kv, inputs)) == 2


def test_bad_layer_ids_are_refused_by_name():
    with pytest.raises(ValueError, match=r"\[8\] out of range"):
        check_aux_layers((2, 4, 8), 8)
    with pytest.raises(ValueError, match="repeat a layer"):
        check_aux_layers(eagle3_default_layers(6), 6)  # (2, 3, 3): too few layers for vLLM's default
    assert check_aux_layers((5, 2, 4), 8) == (2, 4, 5)  # layer order, as vLLM appends them
