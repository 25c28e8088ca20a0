"""What every registered family gets from its entry alone (models/registry.py; docs/architecture/16-family-unit.md,
"Testing a family"): the registry's keys are unique; each compile-check config at real size builds a spec and
abstract params that its weight map reads in full; its GGUF names reach every tensor of its checkpoints; each tiny
config's random checkpoint gives transformers' logits (PyTorch CPU, float32) on ragged, chunked batches. A new family
is checked by registering it."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from jax.sharding import PartitionSpec as P
from transformers import AutoConfig

from tests.helpers.parity import (
    BLOCK_SIZE,
    assert_logits_match_over_two_chunked_steps,
    load_forward,
    pack_rows,
    ragged_sequences,
)
from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_config
from vllm_jax.aot.model_configs import cut_fields, write_config
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.weight_loader import flatten_params
from vllm_jax.models.gguf_family import BLOCK_NAMES, GLOBAL_NAMES
from vllm_jax.models.registry import (
    FAMILIES,
    GGUF_ARCHS,
    param_sources,
    real_configs,
    resolve_architecture,
    tiny_configs,
)
from vllm_jax.sharding.rules import param_partition_spec
from vllm_jax.worker.batch import RowChunk

REAL = real_configs()
TINY = tiny_configs()
# (GGUF architecture, a tiny config of its HF architecture) for the families whose GGUF names are tables (a family
# with its own namer or a stacked-tensor converter has its own GGUF tests: tests/engine/test_gguf_gemma4.py,
# test_gguf_moe.py)
GGUF_TABLES = sorted((arch.name, next(name for name, config in TINY.items()
                                      if config["architectures"][0] == arch.hf_architecture))
                     for arch in GGUF_ARCHS.values() if arch.hf_name is None and arch.tensors is None)


def test_each_architecture_config_and_gguf_name_belongs_to_one_family():
    for key in (lambda f: f.architectures, lambda f: [arch.name for arch in f.gguf], lambda f: list(f.real_configs),
                lambda f: list(f.tiny_configs)):
        names = [name for family in FAMILIES for name in key(family)]
        assert len(names) == len(set(names)), sorted(names)
    for family in FAMILIES:
        for config in (*family.real_configs.values(), *family.tiny_configs.values()):
            assert config["architectures"][0] in family.architectures, family.name


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_size_config_builds_params_its_weight_map_reads_and_its_rules_split(name, tmp_path):
    """The compile check's configs (cut to four layers, as `--layers` cuts them: Gemma 4 keeps two KV-shared ones)
    through the registry: spec, the model's abstract params, a checkpoint tensor for each of them, and partition
    rules (the family's, then the shared ones) that split nearly all of the weights at TP 2 (Granite's odd
    vocabulary keeps its embedding whole: 60%). The full compile runs in .ci/aot_check."""
    config = REAL[name]
    hf_config = AutoConfig.from_pretrained(write_config(tmp_path, config, num_hidden_layers=4,
                                                        **cut_fields(config, 4)))
    family, spec = resolve_architecture(hf_config, 4096)
    assert spec.num_layers == 4 and spec.hidden_size == config["hidden_size"]
    model = build_model(family, spec, "bfloat16", None, abstract=True)
    shapes = {path: leaf.shape for path, leaf in flatten_params(nnx.to_pure_dict(nnx.state(model))).items()}
    sources = param_sources(spec)
    assert set(shapes) <= set(sources), sorted(set(shapes) - set(sources))
    for path, shape in shapes.items():
        assert sources[path].needed(shape), path
    split = [param_partition_spec(path, shape, spec, 2, False, family.sharding_rules) != P() for path, shape in
             shapes.items()]
    sizes = [math.prod(shape) for shape in shapes.values()]
    per_device = sum(size / 2 if halved else size for size, halved in zip(sizes, split))
    assert per_device <= 0.62 * sum(sizes), per_device / sum(sizes)


@pytest.mark.parametrize("gguf_arch, name", GGUF_TABLES)
def test_gguf_names_reach_every_tensor_of_the_tiny_checkpoint(gguf_arch, name):
    """Each tensor an HF checkpoint of the family holds has a GGUF name its entry maps to it (llama's tables under
    the family's overrides), as llama.cpp's converter names them."""
    config = tiny_config(name)
    hf_names = set(getattr(transformers, config.architectures[0])(config).state_dict())
    if config.tie_word_embeddings:
        hf_names.discard("lm_head.weight")
    entry = GGUF_ARCHS[gguf_arch]
    stems = [*GLOBAL_NAMES, *(f"blk.{i}.{stem}" for i in range(config.num_hidden_layers)
                              for stem in {*BLOCK_NAMES, *entry.block_names})]
    reached = {entry.tensor_name(f"{stem}.{kind}") for stem in stems for kind in ("weight", "bias")}
    assert hf_names <= reached, sorted(hf_names - reached)


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_checkpoint_logits_match_transformers_on_ragged_chunked_batches(name, tmp_path):
    """Four sequences of different lengths, each split into two chunks over two steps (the second step reads the
    first's KV from the pages), mixed with a decode-sized row: every computed position's logits match
    transformers within 1e-4. Norms are randomized, so a wrong norm placement shows."""
    hf = make_tiny_checkpoint(name, tmp_path, randomize_norms=True)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences())


FIRST_TINY = sorted(next(iter(family.tiny_configs)) for family in FAMILIES if family.tiny_configs)


@pytest.mark.parametrize("name", FIRST_TINY)
def test_a_sequences_logits_do_not_depend_on_what_shares_its_batch(name, tmp_path):
    """Batch invariance: one sequence's logits in a step of its own equal its logits in the same padded step
    shared with two other sequences (a prefill and a decode-sized row), bit for bit where the family's forward is
    row-wise (dense layers, paged attention) and within float32 rounding where it is not (MoE routing groups the
    batch's tokens by expert, so a row's products are computed in other groups)."""
    make_tiny_checkpoint(name, tmp_path, randomize_norms=True)
    _, params, forward, kv = load_forward(tmp_path)
    seqs = ragged_sequences(seed=3)[:3]

    def logits_of_first(rows: list[RowChunk]) -> np.ndarray:
        fresh = jax.tree.map(jnp.zeros_like, kv)
        return np.asarray(forward(params, fresh, pack_rows(rows, fresh))[1])[0]

    first_blocks = list(range(1, 1 + -(-len(seqs[0]) // BLOCK_SIZE)))
    alone = logits_of_first([RowChunk(seqs[0], 0, first_blocks)])
    others = [RowChunk(seqs[1], 0, list(range(20, 20 + -(-len(seqs[1]) // BLOCK_SIZE)))),
              RowChunk(seqs[2][:1], 0, [40])]
    shared = logits_of_first([RowChunk(seqs[0], 0, first_blocks), *others])
    np.testing.assert_array_equal(shared, alone)
