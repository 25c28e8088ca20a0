"""Our decoder against transformers (PyTorch CPU, float32) on the same tiny random weights."""

from __future__ import annotations

import jax
import pytest

from tests.helpers.parity import (
    BLOCK_SIZE,
    MAX_BLOCKS,
    assert_greedy_matches_transformers,
    assert_logits_match_over_two_chunked_steps,
    load_forward,
    ragged_sequences,
)
from tests.helpers.tiny_models import ARCHS, make_tiny_checkpoint
from vllm_jax.worker.batch import pack_step_inputs


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_match_transformers_on_ragged_chunked_batches(arch, tmp_path):
    """Four sequences of different lengths, each split into two chunks over two steps (the second step reads
    the first step's KV from the pages), mixed with a decode-sized row: every computed position's logits
    match transformers within 1e-4."""
    hf = make_tiny_checkpoint(arch, tmp_path)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences())


@pytest.mark.parametrize("layers", ["switched", "unrolled"])
def test_every_layer_form_matches_transformers(layers, tmp_path):
    """The CPU scan over per-layer arrays (switched matmuls) and the unrolled loop give the stacked scan's
    logits (sliding-window Mistral: the per-layer window rides along the scan)."""
    hf = make_tiny_checkpoint("mistral", tmp_path)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences(), layers=layers)
    _, params, forward, kv = load_forward(tmp_path, layers)
    inputs = pack_step_inputs([], block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS, num_tokens_padded=8,
                              num_seqs_padded=8)
    program = str(jax.make_jaxpr(forward)(params, kv, inputs))
    assert ("scan[" in program and "cond[" in program) == (layers == "switched"), "not the asked layer form"


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_continuation_of_32_tokens_is_token_identical(arch, tmp_path):
    hf = make_tiny_checkpoint(arch, tmp_path, seed=3)
    assert_greedy_matches_transformers(hf, tmp_path)


def test_per_layer_type_rope_parameters_are_refused_where_a_family_does_not_read_them():
    """Gemma 3 style nested `rope_parameters` (one dict per layer type) on an architecture that reads one flat
    dict: a ValueError naming them, not a silent fall back to rope_theta 10000."""
    from transformers import Gemma3TextConfig

    from vllm_jax.model.spec import spec_from_hf_config

    config = Gemma3TextConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_activation="silu")
    config.architectures, config.hidden_act = ["LlamaForCausalLM"], "silu"
    with pytest.raises(ValueError, match=r"rope_parameters per layer type \(full_attention, sliding_attention\)"):
        spec_from_hf_config(config)
