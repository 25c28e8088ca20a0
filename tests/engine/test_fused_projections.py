"""Fused q/k/v (model/fused_projections.py): the layout's columns, which models fuse, the loader's reads of the
fused param from its parts' HF tensors, and seeded random weights that are the same numbers in either layout. The
fused forward's logits against transformers are tests/engine/test_model_parity.py's (every family there fuses at tp 1);
tensor-parallel splits tests/multidevice/test_sharding.py's; updates part by part tests/engine/test_weight_sync.py's."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx
from transformers import AutoConfig

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.fused_projections import fuses_qkv, qkv_layout
from vllm_jax.model.spec import spec_from_hf_config
from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint
from vllm_jax.model_loader.weight_maps import param_sources


@dataclasses.dataclass(frozen=True)
class Shapes:
    num_kv_heads: int = 2
    q_size: int = 12  # 4 heads of 3
    kv_size: int = 6


def test_a_unit_is_one_kv_head_with_its_query_heads():
    layout = qkv_layout(Shapes())
    assert (layout.widths, layout.units, layout.size) == ((6, 3, 3), 2, 24)
    q, k, v = np.arange(12)[None], 100 + np.arange(6)[None], 200 + np.arange(6)[None]
    fused = np.asarray(layout.join([jnp.asarray(a) for a in (q, k, v)]))
    assert fused[0].tolist() == [*range(6), 100, 101, 102, 200, 201, 202, *range(6, 12), 103, 104, 105, 203, 204, 205]
    for p, part in enumerate((q, k, v)):
        np.testing.assert_array_equal(np.asarray(layout.split(jnp.asarray(fused))[p]), part)
        np.testing.assert_array_equal(fused[:, layout.columns(p)], part)
        located = layout.locate(layout.columns(p))
        assert (located[0] == p).all() and located[1].tolist() == list(range(layout.part_size(p)))


def test_only_plain_weights_fuse_and_only_where_tp_divides_the_kv_heads():
    assert fuses_qkv(Shapes(), None, 1) and fuses_qkv(Shapes(), None, 2)
    assert not fuses_qkv(Shapes(), None, 4)  # tp 4 replicates the 2 KV heads while q splits
    assert not fuses_qkv(Shapes(), object(), 1)  # any quantization


def test_the_fused_param_reads_its_parts_and_a_column_slice_reads_only_what_it_covers(tmp_path):
    path = tmp_path / "llama"
    make_tiny_checkpoint("llama", path, seed=4)
    spec = spec_from_hf_config(AutoConfig.from_pretrained(path))
    checkpoint = SafetensorsCheckpoint(path)
    layout = qkv_layout(spec)
    src = param_sources(spec)[("layers", "qkv_proj")]
    shape = (spec.num_layers, spec.hidden_size, layout.size)
    hf = {name: checkpoint.read(name, (slice(None), slice(None))) for name in src.names.flat}
    assert src.needed(shape) == {name: tuple(array.shape) for name, array in hf.items()}
    whole = src.read(checkpoint, (), shape, np.float32)
    for layer in range(spec.num_layers):
        parts = [jnp.asarray(hf[f"model.layers.{layer}.self_attn.{p}.weight"].T) for p in layout.parts]
        np.testing.assert_array_equal(whole[layer], np.asarray(layout.join(parts)))
    reads = []
    read = checkpoint.read
    checkpoint.read = lambda name, index: reads.append((name, index[0])) or read(name, index)
    stop = layout.widths[0] + 1  # unit 0's columns 3 .. stop: q's from its column 3 on, then k's first
    piece = src.read(checkpoint, (slice(1, 2), slice(None), slice(3, stop)), shape, np.float32)
    np.testing.assert_array_equal(piece, whole[1:2, :, 3:stop])
    assert [(name.split(".")[-2], rows.start, rows.stop) for name, rows in reads] == [
        ("q_proj", 3, layout.widths[0]), ("k_proj", 0, 1)]


def test_seeded_random_weights_are_the_same_numbers_in_either_layout(tmp_path):
    path = tmp_path / "llama"
    make_tiny_checkpoint("llama", path, seed=4)
    spec = spec_from_hf_config(AutoConfig.from_pretrained(path))

    class Separate(DecoderLM):
        fuses_projections = False

    fused = DecoderLM(spec, jnp.float32, rngs=nnx.Rngs(0)).layers
    separate = Separate(spec, jnp.float32, rngs=nnx.Rngs(0)).layers
    layout = qkv_layout(spec)
    for name, part in zip(layout.parts, layout.split(fused.qkv_proj[...])):
        np.testing.assert_array_equal(np.asarray(part), np.asarray(getattr(separate, name)[...]))
    np.testing.assert_array_equal(np.asarray(fused.o_proj[...]), np.asarray(separate.o_proj[...]))
    np.testing.assert_array_equal(np.asarray(fused.down_proj[...]), np.asarray(separate.down_proj[...]))
