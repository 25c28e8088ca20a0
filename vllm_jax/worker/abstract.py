"""The engine's programs without their arrays: abstract weights and KV cache, on any devices.

`AbstractEngine.build(config, devices)` makes what `ModelRunner` makes before warm-up (the model's graph for the
config's platform and attention backend, the params as ShapeDtypeStructs carrying the partition rules'
NamedShardings, the block-table width, the buckets) and allocates nothing, so every program of warm-up's plan
(worker/compilation.py) can be lowered and compiled for devices this host does not have: vllm_jax.aot's
compile-only TPU and GPU targets. `compilation(num_blocks)` gives the CompilationManager over a DeviceStep with
an abstract KV cache of that many blocks; its plan is the runner's own (docs/architecture/05-worker.md, "Compilation and
warm-up").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.config import EngineConfig
from vllm_jax.model.eagle3_head import Eagle3Head
from vllm_jax.model.eagle3_spec import Eagle3Spec
from vllm_jax.model.quantization import KeptFormats
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model_loader.loader import model_quantization
from vllm_jax.model_loader.weight_loader import NP_DTYPES, flatten_params, unflatten_params
from vllm_jax.pallas_kernels.dispatch import block_table_width
from vllm_jax.sharding import check_tensor_parallel_layout, kv_cache_partition_spec, make_mesh, param_partition_spec
from vllm_jax.worker.buckets import geometric_buckets, seq_bucket_for
from vllm_jax.worker.compilation import CompilationManager, StepShapes, TraceCounter
from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.draft_chain import chain_buckets
from vllm_jax.worker.draft_step import DraftStep
from vllm_jax.worker.eagle_step import EagleStep, eagle3_aux_layers
from vllm_jax.worker.lora_slots import LoRASlotArrays, target_shapes
from vllm_jax.worker.kv_cache import (blocks_per_sequence, cache_shape, lane_dense_cache, min_kv_blocks,
                                     spec_bytes_per_block)
from vllm_jax.worker.speculators import SpeculatorModel

DeviceStepFactory = Callable[..., DeviceStep]


@dataclass
class AbstractEngine:
    config: EngineConfig
    spec: DecoderSpec
    mesh: Mesh
    attention_backend: str  # resolved for config.platform
    graphdef: nnx.GraphDef
    params: nnx.State  # ShapeDtypeStructs with NamedShardings over `mesh`
    max_blocks_per_seq: int
    token_buckets: list[int]
    seq_buckets: list[int]
    # method draft_model / eagle3: the draft model or the head, its params abstract
    speculator: SpeculatorModel | None = None

    @classmethod
    def build(cls, config: EngineConfig, devices: list | tuple) -> AbstractEngine:
        """The runner's construction (worker/model_runner.py) up to the KV cache, without allocating."""
        mc, sc, tp = config.model_config, config.scheduler_config, config.parallel_config.tensor_parallel_size
        entry, spec = resolve_architecture(mc.hf_config, mc.max_model_len)
        mesh = make_mesh(tp, 1, devices=list(devices))
        backend = config.resolved_attention_backend
        check_tensor_parallel_layout(spec, tp, backend)
        head = None
        if _method(config) == "eagle3":
            if tp > 1:
                raise ValueError("speculative_config method 'eagle3' runs with tensor_parallel_size 1 only")
            head = _abstract_head(config, backend, mesh)
        aux_layers = eagle3_aux_layers(config.speculative_config.model, spec.num_layers) if head else ()
        graphdef, params = _abstract_model(config, entry, spec, backend, mesh, aux_layers,
                                           quantization=model_quantization(config.model_config))
        speculator = head
        if config.draft_model_config is not None:
            draft_entry, draft_spec = resolve_architecture(config.draft_model_config.hf_config, mc.max_model_len)
            check_tensor_parallel_layout(draft_spec, tp, backend)
            speculator = SpeculatorModel(*_abstract_model(config, draft_entry, draft_spec, backend, mesh), draft_spec)
        width = block_table_width(blocks_per_sequence(mc.max_model_len, config.cache_config.block_size), backend,
                                  config.platform)
        return cls(config, spec, mesh, backend, graphdef, params, width,
                   geometric_buckets(sc.min_token_bucket, sc.max_num_batched_tokens, sc.bucket_growth),
                   geometric_buckets(min(sc.min_seq_bucket, sc.max_num_seqs), sc.max_num_seqs, sc.bucket_growth),
                   speculator)

    @property
    def kv_spec(self) -> PartitionSpec:
        return kv_cache_partition_spec(self.spec, self.config.parallel_config.tensor_parallel_size,
                                       lane_dense_cache(self.config, self.spec))

    @property
    def kv_shards(self) -> int:
        """How many ways each block is split over the devices (1: every device holds whole blocks)."""
        return self.config.parallel_config.tensor_parallel_size if self.kv_spec != PartitionSpec() else 1

    @property
    def kv_bytes_per_block(self) -> int:
        """One block's bytes on one device (the engine's budget is per device: kv_cache.size_kv_cache)."""
        speculator = self.speculator
        second = speculator.cache_layout(self.config, self.mesh).bytes_per_block if speculator else 0
        return self.target_kv_bytes_per_block + second

    @property
    def target_kv_bytes_per_block(self) -> int:
        """The target's own cache's share of a block (a draft model's cache holds the rest)."""
        s, mc = self.spec, self.config.model_config
        return spec_bytes_per_block(s, self.config.cache_config.block_size, mc.kv_cache_dtype,
                                    lane_dense_cache(self.config, s)) // self.kv_shards

    @property
    def weight_bytes(self) -> int:
        """The params' bytes on one device (the first; the rules split evenly or replicate)."""
        return sum(shard_bytes(leaf) for leaf in jax.tree.leaves(self.params))

    def min_blocks(self) -> int:
        """The smallest cache the engine starts with: one max_model_len request and the null block."""
        return min_kv_blocks(self.config)

    def kv_cache(self, num_blocks: int) -> jax.ShapeDtypeStruct:
        return cache_shape(self.config, self.spec, num_blocks).abstract(NamedSharding(self.mesh, self.kv_spec))

    def buckets(self) -> list[tuple[int, int]]:
        """(tokens, sequences) of every forward program, as the runner pairs them."""
        max_num_seqs = self.config.scheduler_config.max_num_seqs
        return [(t, seq_bucket_for(t, self.seq_buckets, max_num_seqs)) for t in self.token_buckets]

    def compilation(self, num_blocks: int, buckets: list[tuple[int, int]] | None = None,
                    device_step: DeviceStepFactory = DeviceStep) -> CompilationManager:
        """Warm-up's plan over a DeviceStep (`device_step` builds it, with DeviceStep's arguments) holding the
        abstract params and a `num_blocks` cache; `buckets` (default: all) narrows the forward programs."""
        counter = TraceCounter()
        mc = self.config.model_config
        step = device_step(self.graphdef, self.params, self.kv_cache(num_blocks), self.mesh, mc.max_logprobs,
                           on_trace=counter, num_slots=self.config.scheduler_config.max_num_seqs,
                           returns_aux=self.speculator is not None and isinstance(self.speculator.spec, Eagle3Spec))
        if self.config.lora_config is not None:  # the stacked slots, abstract like the params
            step.lora = LoRASlotArrays(self.config.lora_config, target_shapes(self.spec), mc.dtype, self.mesh,
                                       self.params, counter, abstract=True)
        shapes = StepShapes(buckets or self.buckets(), self.config.cache_config.block_size, self.max_blocks_per_seq,
                            self.spec.vocab_size, mc.max_logprobs, self.config.async_scheduling,
                            self.config.speculative_config is not None, lora=self.config.lora_config is not None)
        programs, chains = None, None
        if self.speculator is not None:
            layout = self.speculator.cache_layout(self.config, self.mesh)
            kv_cache = dataclasses.replace(layout.shape, num_blocks=num_blocks).abstract(layout.sharding)
            programs = self.speculator.programs(self.config, kv_cache, self.params, step.load_or_compile, counter)
        drafter = programs if isinstance(programs, DraftStep) else None
        eagle = programs if isinstance(programs, EagleStep) else None
        if drafter is not None:
            max_num_seqs = self.config.scheduler_config.max_num_seqs
            chains = chain_buckets(self.token_buckets, lambda t: seq_bucket_for(t, self.seq_buckets, max_num_seqs),
                                   max_num_seqs)
            if buckets is not None:  # narrowed: the chains of those token buckets only
                chains = [pair for pair in chains if pair in buckets]
        return CompilationManager(step, counter, shapes, None, drafter=drafter, chain_buckets=chains, eagle=eagle)


def _abstract_model(config: EngineConfig, entry, spec: DecoderSpec, backend: str, mesh: Mesh,
                    aux_layers: tuple[int, ...] = (), *,
                    quantization: str | KeptFormats | None = None) -> tuple[nnx.GraphDef, nnx.State]:
    """The model as the runner builds it (model_loader.build_model's arguments), every param a ShapeDtypeStruct
    on its partition rule's sharding, laid out for the platform's layer loop (`aux_layers`: EAGLE-3's;
    `quantization`: the target's --quantization, quantized values and their scales)."""
    mc, pc = config.model_config, config.parallel_config
    kwargs = {} if quantization is None else {"quantization": quantization}
    if quantization is not None and mc.quantization_group_size is not None:
        kwargs["quantization_group_size"] = mc.quantization_group_size
    if pc.tensor_parallel_size > 1 and backend != "xla":
        kwargs["mesh"] = mesh  # the Pallas kernels run inside shard_map over it
    if pc.enable_expert_parallel and getattr(spec, "num_experts", None):
        kwargs["expert_mesh"] = mesh
    dtype = jnp.dtype(NP_DTYPES[mc.dtype])
    model = nnx.eval_shape(lambda: entry.model_class(spec, dtype, rngs=nnx.Rngs(0), attention_backend=backend,
                                                     platform=config.platform, **kwargs))
    graphdef, state = nnx.split(model)

    def place(path: tuple[str, ...], leaf: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        rule = param_partition_spec(path, leaf.shape, spec, pc.tensor_parallel_size, pc.enable_expert_parallel)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, rule))

    flat = flatten_params(nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, unflatten_params({path: place(path, leaf) for path, leaf in flat.items()}))
    model = nnx.merge(graphdef, state)
    model.scan_layers = config.scan_layers
    model.aux_hidden_layers = aux_layers
    graphdef, params = nnx.split(model)
    if not config.scan_layers or (config.platform == "cpu" and model.switched_scan):
        _unstack_abstract(params)
    return graphdef, params


def _unstack_abstract(state: nnx.State) -> None:
    """model.layers.unstack_layers for abstract params: each stacked [L, ...] param becomes L per-layer ones."""
    for variable in state["layers"].values():
        value = variable.get_value()
        spec = PartitionSpec(*tuple(value.sharding.spec)[1:])
        one = jax.ShapeDtypeStruct(value.shape[1:], value.dtype, sharding=NamedSharding(value.sharding.mesh, spec))
        variable.set_value(tuple(one for _ in range(value.shape[0])))


def shard_bytes(leaf: jax.ShapeDtypeStruct) -> int:
    """The bytes of one device's shard of an abstract array (all of it without a sharding)."""
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    size = 1
    for d in shape:
        size *= d
    return size * jnp.dtype(leaf.dtype).itemsize


def _method(config: EngineConfig) -> str | None:
    return config.speculative_config.method if config.speculative_config is not None else None


def _abstract_head(config: EngineConfig, backend: str, mesh: Mesh) -> SpeculatorModel:
    """The EAGLE-3 head as the runner loads it (model_loader.eagle3_loader), its params abstract and replicated."""
    from vllm_jax.model_loader.eagle3_loader import read_eagle3_spec
    from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint

    directory = config.speculative_config.model
    spec = read_eagle3_spec(directory)
    own_embedding = "embed_tokens.weight" in SafetensorsCheckpoint(Path(directory)).names()
    dtype = jnp.dtype(NP_DTYPES[config.model_config.dtype])
    head = nnx.eval_shape(lambda: Eagle3Head(spec, dtype, rngs=nnx.Rngs(0), own_embedding=own_embedding,
                                             attention_backend=backend, platform=config.platform))
    graphdef, state = nnx.split(head)
    replicated = NamedSharding(mesh, PartitionSpec())
    flat = flatten_params(nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, unflatten_params(
        {path: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated) for path, leaf in flat.items()}))
    return SpeculatorModel(graphdef, state, spec, own_embedding)
