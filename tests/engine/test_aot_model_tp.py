"""The model's forward under tensor parallelism compiled for real TPU slices (vllm_jax.aot compile-only devices):
the Mosaic kernels inside the model's shard_map must compile at Llama-3-8B's heads (32 query, 8 or 2 KV,
head_dim 128; two layers) with the 131072-context block table, and the donated KV cache must be updated in
place (its per-device bytes aliased). Skipped without libtpu (`jax[tpu]` at jax's version)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from transformers import LlamaConfig

from vllm_jax.aot import targets
from vllm_jax.model.decoder import DecoderLM, forward
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pallas_kernels.kv_layout import row_lanes
from vllm_jax.sharding import kv_cache_partition_spec, param_partition_spec

NUM_BLOCKS, BLOCK_SIZE, HEAD_DIM, TOKENS, SEQS = 512, 16, 128, 256, 256
TABLE_WIDTH = 131072 // BLOCK_SIZE


def _abstract_step(mesh, spec, tp: int):
    """The model built for TPU over `mesh`, with abstract params, KV cache and inputs on their shardings."""
    model = nnx.eval_shape(lambda: DecoderLM(spec, jnp.bfloat16, rngs=nnx.Rngs(0), attention_backend="auto",
                                             platform="tpu", mesh=mesh))
    graphdef, state = nnx.split(model)

    def place(path, leaf):
        names = tuple(str(getattr(key, "key", key)) for key in path)
        sharding = NamedSharding(mesh, param_partition_spec(names, leaf.shape, spec, tp))
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    kv = jax.ShapeDtypeStruct((spec.num_layers, NUM_BLOCKS, BLOCK_SIZE, row_lanes(spec.num_kv_heads, HEAD_DIM)),
                              jnp.bfloat16, sharding=NamedSharding(mesh, kv_cache_partition_spec(spec, tp, True)))
    i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32, sharding=NamedSharding(mesh, P()))
    inputs = StepInputs(input_ids=i32((TOKENS,)), positions=i32((TOKENS,)), slot_mapping=i32((TOKENS,)),
                        block_tables=i32((SEQS, TABLE_WIDTH)), seq_lens=i32((SEQS,)),
                        query_start_loc=i32((SEQS + 1,)), num_seqs=i32((1,)), logits_indices=i32((SEQS,)))
    return model, graphdef, jax.tree_util.tree_map_with_path(place, state), kv, inputs


@pytest.mark.parametrize("name, tp, kv_heads", [("v6e:2x2", 4, 8), ("v6e:2x2", 4, 2), ("v5e:2x4", 8, 8)])
def test_the_tp_forward_compiles_with_the_kernels_and_the_cache_in_place(name, tp, kv_heads):
    reason = targets.available("tpu")
    if reason:
        pytest.skip(reason)
    target = targets.get_target(name)
    hf = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                     num_attention_heads=32, num_key_value_heads=kv_heads, max_position_embeddings=131072,
                     architectures=["LlamaForCausalLM"])
    _, spec = resolve_architecture(hf)
    mesh = target.mesh((1, tp))
    model, graphdef, state, kv, inputs = _abstract_step(mesh, spec, tp)
    assert model.kernels.backend.name == "pallas_tpu" and model.kernels.mesh is mesh
    with jax.set_mesh(mesh):
        compiled = jax.jit(functools.partial(forward, graphdef), donate_argnums=(1,)).lower(
            state, kv, inputs).compile()
    # attention (the KV write into the lane-dense cache is an XLA scatter: pallas_kernels/kv_write.py)
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1
    per_device_heads = kv_heads // tp if kv_heads % tp == 0 else kv_heads  # replicated below tp
    cache_bytes = spec.num_layers * NUM_BLOCKS * BLOCK_SIZE * row_lanes(per_device_heads, HEAD_DIM) * 2
    assert compiled.memory_analysis().alias_size_in_bytes == cache_bytes
