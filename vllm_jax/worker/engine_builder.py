"""One construction of the engine's pieces from an EngineConfig: real for the runner, abstract for compile-check.

`build_engine(config, devices)` gives what `ModelRunner` runs on: the model's graph and its params placed on the
partition rules' shardings (laid out for the platform's layer loop), the mesh, the speculator (a draft model or
an EAGLE-3 head), the block-table width and the buckets; `EngineParts.size_kv_cache` sizes the cache from the
memory budget and `EngineParts.compilation(num_blocks)` makes the KV cache and the DeviceStep and returns warm-up's
CompilationManager. `build_engine(config, devices, abstract=True)` is the same code with every param, cache and
LoRA slot a ShapeDtypeStruct on its NamedSharding and nothing allocated or read: what `vllm-jax compile-check`
(vllm_jax.aot) compiles for devices this host does not have. The two modes differ only where arrays are made
(the weight loader, `EngineParts.make_cache`, the LoRA slots), so compile-check compiles the runner's own plan
and refuses what the runner refuses (docs/architecture/05-worker.md, "Compilation and warm-up").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.attention import AttentionBackend
from vllm_jax.config import EngineConfig
from vllm_jax.lora.device.slots import LoRASlotArrays, target_shapes
from vllm_jax.model.moe_spec import MoeSpec
from vllm_jax.model.quantization import KeptFormats
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.state_cache import HybridCache
from vllm_jax.model_loader.loader import build_model, model_quantization
from vllm_jax.model_loader.source import ModelSource
from vllm_jax.models.registry import family_of, resolve_architecture
from vllm_jax.multimodal.device.encoder_step import MultimodalStep, build_multimodal_step
from vllm_jax.pooling.device.pooling_step import PoolingCompilation, pooling_device_step
from vllm_jax.sharding import check_tensor_parallel_layout, kv_cache_partition_spec, make_mesh, param_partition_spec
from vllm_jax.sharding.mesh import MODEL_AXIS
from vllm_jax.spec_decode.device.draft_chain import chain_buckets
from vllm_jax.spec_decode.device.draft_step import DraftStep
from vllm_jax.spec_decode.device.eagle_step import EagleStep, eagle3_aux_layers
from vllm_jax.spec_decode.device.speculators import SpeculatorModel, load_draft_model, load_eagle3
from vllm_jax.worker import kv_cache as kv_cache_module
from vllm_jax.worker.buckets import geometric_buckets, max_step_rows, pick_bucket, seq_bucket_for
from vllm_jax.worker.compilation import CompilationManager, StepShapes, TraceCounter, program_store
from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.kv_budget import measures_device_memory, probe_temp_bytes, sized_by_probes
from vllm_jax.worker.kv_cache import (
    HybridCacheShape,
    KVCacheShape,
    allocate_kv_cache,
    blocks_per_sequence,
    cache_shape,
    lane_dense_cache,
    min_kv_blocks,
    size_kv_cache,
    spec_bytes_per_block,
)
from vllm_jax.worker.warmup import WarmupPart

logger = logging.getLogger(__name__)

DeviceStepFactory = Callable[..., DeviceStep]


@dataclass(frozen=True)
class MemoryProbe:
    """What the KV budget reads of an accelerator (worker/kv_budget.py): the device's memory (the bytes its
    allocator may hold, the bytes in use: this engine's weights and whatever else holds memory there) and the
    largest temporaries of the programs a DeviceStep compiles for some StepShapes. The engine reads jax's; a
    test passes its own figures."""

    device_memory: Callable[[jax.Device], tuple[int, int]] = kv_cache_module.device_memory
    temp_bytes: Callable[[DeviceStep, StepShapes], int] = probe_temp_bytes


@dataclass(frozen=True)
class KernelChoices:
    """Every decision of construction that depends on the attention backend, made by `kernel_choices` alone."""

    # resolved once, for the platform the programs are built for (docs/architecture/07-attention.md,
    # "Backend selection")
    backend: AttentionBackend
    # tp > 1: the Pallas kernels run inside shard_map over it; the xla backend's ops GSPMD partitions, and it keeps
    # the native CPU kernels off under it (attention/xla.py). None: one device.
    kernel_mesh: Mesh | None
    max_blocks_per_seq: int  # the block table's width (a kernel may pad it)
    lane_dense_cache: bool  # pallas_tpu's K/V cache layout (kv_cache.lane_dense_cache)


def kernel_choices(config: EngineConfig, spec: DecoderSpec, mesh: Mesh) -> KernelChoices:
    """The backend's choices for the target model, its tensor-parallel layout checked against the kernels."""
    mc, cc, tp = config.model_config, config.cache_config, config.parallel_config.tensor_parallel_size
    backend = config.resolved_attention_backend
    check_tensor_parallel_layout(spec, tp, backend)
    width = backend.block_table_width(blocks_per_sequence(mc.max_model_len, cc.block_size))
    return KernelChoices(backend, mesh if tp > 1 else None, width,
                         lane_dense_cache(config, spec))


@dataclass
class FeatureSteps:
    """The features' device steps the engine builder makes beside the DeviceStep (None: that feature is off)."""

    drafter: DraftStep | None = None  # speculative_config method draft_model
    eagle: EagleStep | None = None  # method eagle3
    multimodal: MultimodalStep | None = None  # a vision-language model's encoder

    def warmup_parts(self) -> list[WarmupPart]:
        """Their programs in warm-up's plan, in its fixed order (worker/warmup.py)."""
        return [part for part in (self.drafter, self.eagle, self.multimodal) if part is not None]


@dataclass
class KVCacheSizing:
    num_blocks: int
    probe: DeviceStep | None  # the probe compile's step (accelerators): its samplers serve the engine's


@dataclass
class EngineParts:
    """What the engine's programs are made of (see the module docstring); `abstract`: every array abstract."""

    config: EngineConfig
    spec: DecoderSpec
    mesh: Mesh
    kernels: KernelChoices
    graphdef: nnx.GraphDef
    params: nnx.State  # placed arrays, or ShapeDtypeStructs with NamedShardings over `mesh`
    aux_layers: tuple[int, ...]  # EAGLE-3: the target layers whose input states the forward also returns
    speculator: SpeculatorModel | None  # method draft_model / eagle3: the draft model or the head
    token_buckets: list[int]
    seq_buckets: list[int]
    abstract: bool

    @property
    def attention_backend(self) -> AttentionBackend:
        return self.kernels.backend

    @property
    def max_blocks_per_seq(self) -> int:
        return self.kernels.max_blocks_per_seq

    @property
    def max_rows(self) -> int:
        """The most rows (logits rows) one step holds: the largest sequence bucket."""
        return engine_max_rows(self.config)

    def seq_bucket(self, num_tokens_padded: int) -> int:
        return seq_bucket_for(num_tokens_padded, self.seq_buckets, self.max_rows)

    def buckets(self) -> list[tuple[int, int]]:
        """(tokens, sequences) of every forward program, as the runner pairs them."""
        return [(t, self.seq_bucket(t)) for t in self.token_buckets]

    def step_shapes(self, buckets: list[tuple[int, int]] | None = None) -> StepShapes:
        config = self.config
        return StepShapes(buckets or self.buckets(), config.cache_config.block_size, self.max_blocks_per_seq,
                          self.spec.vocab_size, config.async_scheduling,
                          config.speculative_config is not None, lora=config.lora_config is not None,
                          mm_hidden=self.spec.mm_embed_width if getattr(self.spec, "vision", None) else 0,
                          num_scheduler_steps=config.scheduler_config.num_scheduler_steps,
                          chunk_max_tokens=pick_bucket(self.token_buckets, config.scheduler_config.max_num_seqs),
                          states=self.spec.state_layout is not None)

    # --- the KV cache ---
    @property
    def kv_sharding(self) -> NamedSharding | HybridCache:
        """The K/V cache's sharding; a hybrid model's cache has one per part (its states replicated)."""
        tp = self.config.parallel_config.tensor_parallel_size
        kv = NamedSharding(self.mesh, kv_cache_partition_spec(self.spec, tp, self.kernels.lane_dense_cache))
        if self.spec.state_layout is None:
            return kv
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return HybridCache(kv=kv, conv=replicated, recurrent=replicated)

    @property
    def kv_shards(self) -> int:
        """How many ways each block is split over the devices (1: every device holds whole blocks)."""
        sharding = self.kv_sharding
        split = (sharding.kv if isinstance(sharding, HybridCache) else sharding).spec != PartitionSpec()
        return self.config.parallel_config.tensor_parallel_size if split else 1

    @property
    def target_kv_bytes_per_block(self) -> int:
        """The target's own cache's share of a block on one device (a draft model's cache holds the rest)."""
        mc = self.config.model_config
        return spec_bytes_per_block(self.spec, self.config.cache_config.block_size, mc.kv_cache_dtype,
                                    self.kernels.lane_dense_cache) // self.kv_shards

    @property
    def speculator_kv_bytes_per_block(self) -> int:
        speculator = self.speculator
        return speculator.cache_layout(self.config, self.mesh).bytes_per_block if speculator else 0

    @property
    def kv_bytes_per_block(self) -> int:
        """One block's bytes on one device (the engine's budget is per device: kv_cache.size_kv_cache)."""
        return self.target_kv_bytes_per_block + self.speculator_kv_bytes_per_block

    @property
    def weight_bytes(self) -> int:
        """This engine's params (the target's and a speculator's) in bytes on one device (the first; the rules
        split evenly or replicate)."""
        states = (self.params,) + ((self.speculator.params,) if self.speculator else ())
        return sum(shard_bytes(leaf) for leaf in jax.tree.leaves(states))

    def min_blocks(self) -> int:
        """The smallest cache the engine starts with: one max_model_len request and the null block."""
        return min_kv_blocks(self.config)

    def kv_cache(self, num_blocks: int) -> jax.ShapeDtypeStruct | HybridCache:
        """The target's cache of `num_blocks`, abstract (in either mode: the probe compiles over it)."""
        return cache_shape(self.config, self.spec, num_blocks).abstract(self.kv_sharding)

    def make_cache(self, shape: KVCacheShape | HybridCacheShape,
                   sharding: NamedSharding | HybridCache) -> jax.Array | jax.ShapeDtypeStruct | HybridCache:
        """A cache of `shape`: allocated (zeroed on its devices), or abstract."""
        return shape.abstract(sharding) if self.abstract else allocate_kv_cache(shape, sharding)

    def size_kv_cache(self, memory: MemoryProbe) -> KVCacheSizing:
        """The cache's blocks from the memory budget (worker/kv_budget.py); on an accelerator the programs'
        temporaries come from the two-stage probe of the largest bucket (kv_budget.sized_by_probes), whose
        programs the engine's step adopts."""
        def blocks_for(temp_bytes: int) -> int:
            return size_kv_cache(self.config, self.spec, self.kv_shards, temp_bytes, device=self.mesh.devices.flat[0],
                                 extra_bytes_per_block=self.speculator_kv_bytes_per_block,
                                 read_memory=memory.device_memory, own_weight_bytes=self.weight_bytes).num_blocks

        if not measures_device_memory(self.config):
            return KVCacheSizing(blocks_for(0), None)
        shapes = self.step_shapes()
        largest = dataclasses.replace(shapes, buckets=shapes.buckets[-1:])
        num_seqs = largest.buckets[0][1]
        predicted = self.predicted_logits(num_seqs)
        samplers = self.probe_step(self.min_blocks())
        probe, logits_for = samplers, {}  # the forward's probe step, and the logits it records

        def forward_temps(num_blocks: int) -> int:
            nonlocal probe
            probe = self.probe_step(num_blocks)
            return memory.temp_bytes(probe, largest, samplers=False, logits_for=logits_for)

        num_blocks, _ = sized_by_probes(
            blocks_for, lambda: memory.temp_bytes(samplers, largest, forwards=False, logits_for={num_seqs: predicted}),
            forward_temps)
        actual = logits_for.get(num_seqs)
        if actual is not None and actual != predicted:
            # the forward laid its logits out otherwise than predicted: its samplers compile for those instead
            logger.info("KV probe: the forward's logits are %s, not as predicted; compiling the samplers for them",
                        actual.sharding)
            memory.temp_bytes(probe, largest, forwards=False, logits_for={num_seqs: actual})
        probe.adopt(samplers)
        return KVCacheSizing(num_blocks, probe)

    def probe_step(self, num_blocks: int) -> DeviceStep:
        """A DeviceStep like the engine's (slots, aux outputs) over an abstract cache of `num_blocks`, for the KV
        probe's compiles: nothing is allocated."""
        return DeviceStep(self.graphdef, self.params, self.kv_cache(num_blocks), self.mesh,
                          self.config.model_config.max_logprobs, num_slots=self.config.scheduler_config.max_num_seqs,
                          returns_aux=bool(self.aux_layers))

    def predicted_logits(self, num_seqs: int) -> jax.ShapeDtypeStruct:
        """The forward's float32 [num_seqs, vocab] logits as it lays them out (replicated; vocab-sharded over the
        model axis under tensor parallelism, where GSPMD leaves the LM head's output), so the KV probe compiles
        the samplers before the forward; the compiled forward's own layout is checked against it."""
        tp = self.config.parallel_config.tensor_parallel_size
        spec = PartitionSpec(None, MODEL_AXIS) if tp > 1 else PartitionSpec()
        return jax.ShapeDtypeStruct((num_seqs, self.spec.vocab_size), jnp.float32,
                                    sharding=NamedSharding(self.mesh, spec))

    # --- the programs ---
    def compilation(self, num_blocks: int, buckets: list[tuple[int, int]] | None = None, *,
                    device_step: DeviceStepFactory = DeviceStep, cache_dir: str | None = None,
                    adopt_from: DeviceStep | None = None) -> CompilationManager:
        """Warm-up's plan over a DeviceStep (`device_step` builds it, with DeviceStep's arguments) holding the
        params and a `num_blocks` cache (with the LoRA slots and the speculator's programs and cache):
        CompilationManager.device is the engine's step. `buckets` (default: all) narrows the forward programs;
        `cache_dir`: the compilation cache's (None: off); `adopt_from`: the KV probe's step, whose programs it
        adopts."""
        config, mc, sc = self.config, self.config.model_config, self.config.scheduler_config
        if config.pooler_config is not None:  # the pooling runner's programs join the step
            device_step = pooling_device_step(config, self.spec, self.mesh, self.abstract, device_step)
        counter = TraceCounter()
        kv_cache = self.make_cache(cache_shape(config, self.spec, num_blocks), self.kv_sharding)
        lora = None
        if config.lora_config is not None:  # the stacked adapter slots, sharded like their base layers
            lora = LoRASlotArrays(config.lora_config, target_shapes(self.spec), mc.dtype, self.mesh, self.params,
                                  counter, abstract=self.abstract)
        speculator = self.speculator
        state = ((self.params, kv_cache) + ((speculator.params,) if speculator else ())
                 + ((lora.arrays,) if lora is not None else ()))
        store = program_store(config, cache_dir, list(self.mesh.devices.flat), state)
        step = device_step(self.graphdef, self.params, kv_cache, self.mesh, mc.max_logprobs, store=store,
                           on_trace=counter, num_slots=sc.max_num_seqs, returns_aux=bool(self.aux_layers))
        step.lora = lora
        if adopt_from is not None:
            step.adopt(adopt_from)  # the KV probe's programs, compiled once: warm-up skips them
        features = FeatureSteps(multimodal=build_multimodal_step(config, self.spec, step))  # None: no vision tower
        if speculator is not None:  # its cache shares the target's block ids
            layout = speculator.cache_layout(config, self.mesh)
            draft_cache = self.make_cache(dataclasses.replace(layout.shape, num_blocks=num_blocks), layout.sharding)
            programs = speculator.programs(config, draft_cache, self.params, step.load_or_compile, counter)
            if isinstance(programs, DraftStep):
                features.drafter = programs
                programs.chain_buckets = chain_buckets(self.token_buckets, self.seq_bucket, sc.max_num_seqs)
                if buckets is not None:  # narrowed: the chains of those token buckets only
                    programs.chain_buckets = [pair for pair in programs.chain_buckets if pair in buckets]
            else:
                features.eagle = programs
        manager = PoolingCompilation if config.pooler_config is not None else CompilationManager
        return manager(step, counter, self.step_shapes(buckets), cache_dir, parts=features.warmup_parts(),
                       features=features)


def engine_max_rows(config: EngineConfig) -> int:
    """`max_step_rows` for this engine: with speculation, its proposals' logits rows beside the requests'."""
    sc, speculative = config.scheduler_config, config.speculative_config
    if speculative is None:
        return sc.max_num_seqs
    return max_step_rows(sc.max_num_seqs, sc.max_num_batched_tokens, speculative.num_speculative_tokens,
                         speculative.disable_by_batch_size)


def build_engine(config: EngineConfig, devices: Sequence | None = None, *, abstract: bool = False,
                 random_weights: bool = False) -> EngineParts:
    """The engine's pieces for `config` on `devices` (default: jax's), every refusal of a config the engine
    cannot run raised here (see the module docstring); `random_weights`: seeded random params, no checkpoint."""
    mc, sc, tp = config.model_config, config.scheduler_config, config.parallel_config.tensor_parallel_size
    entry, spec = resolve_architecture(mc.hf_config, mc.max_model_len)
    mesh = make_mesh(tp, 1, devices=None if devices is None else list(devices))
    kernels = kernel_choices(config, spec, mesh)
    if config.lora_config is not None:
        check_lora_supported(spec)
    load = ModelLoader(config, mesh, kernels, abstract)
    method = config.speculative_config.method if config.speculative_config is not None else None
    # EAGLE-3: the head, and the target layers whose states it reads (the target's forward returns them)
    head = load_eagle3(config, spec, mesh, kernels.backend, abstract=abstract) if method == "eagle3" else None
    aux_layers = eagle3_aux_layers(config.speculative_config.model, spec.num_layers) if head is not None else ()
    graphdef, params = load(entry, spec, None if random_weights else mc.source, aux_layers,
                            quantization=model_quantization(mc))
    speculator = head or (load_draft_model(config, kernels.backend, load, random_weights)
                          if method == "draft_model" else None)
    max_rows = engine_max_rows(config)
    return EngineParts(config, spec, mesh, kernels, graphdef, params, aux_layers, speculator,
                       geometric_buckets(sc.min_token_bucket, sc.max_num_batched_tokens, sc.bucket_growth),
                       geometric_buckets(min(sc.min_seq_bucket, max_rows), max_rows, sc.bucket_growth), abstract)


@dataclass(frozen=True)
class ModelLoader:
    """Loads a model (the target, or a draft) for the engine: its graph and its params on the partition rules'
    shardings (abstract ones in abstract mode), laid out for the layer loop the platform runs."""

    config: EngineConfig
    mesh: Mesh
    kernels: KernelChoices
    abstract: bool

    def __call__(self, entry: object, spec: DecoderSpec, source: ModelSource | None,
                 aux_layers: tuple[int, ...] = (), *,
                 quantization: str | KeptFormats | None = None) -> tuple[nnx.GraphDef, nnx.State]:
        """Random params without a source; `aux_layers`: the layers whose input states its forward also
        returns (EAGLE-3); `quantization`: --quantization (for gguf the file's KeptFormats), the target's only
        (a draft model stays in the model dtype)."""
        config, mc = self.config, self.config.model_config
        model = build_model(entry, spec, mc.dtype, source, attention_backend=self.kernels.backend.name,
                            platform=config.platform, mesh=self.kernels.kernel_mesh, seed=mc.seed,
                            sharding_for=self._sharding_for(spec), model_kwargs=self._expert_parallel_kwargs(spec),
                            quantization=quantization,
                            quantization_group_size=mc.quantization_group_size if quantization else None,
                            abstract=self.abstract)
        # On CPU a scan reads per-layer arrays through switched matmuls (model/weight_forms/layer_switch.py).
        switched_scan = config.scan_layers and config.platform == "cpu" and model.switched_scan
        model.scan_layers = config.scan_layers
        model.aux_hidden_layers = aux_layers
        graphdef, params = nnx.split(model)
        if not config.scan_layers or switched_scan:
            unstack_layers(params)
        return graphdef, params

    def _sharding_for(self, spec: DecoderSpec) -> Callable[[tuple[str, ...], tuple[int, ...]], NamedSharding]:
        pc = self.config.parallel_config
        rules = family_of(spec.architecture).sharding_rules

        def sharding_for(path: tuple[str, ...], shape: tuple[int, ...]) -> NamedSharding:
            rule = param_partition_spec(path, shape, spec, pc.tensor_parallel_size, pc.enable_expert_parallel, rules)
            return NamedSharding(self.mesh, rule)

        return sharding_for

    def _expert_parallel_kwargs(self, spec: DecoderSpec) -> dict:
        """With --enable-expert-parallel, MoE models dispatch tokens to experts sharded over the "model" axis."""
        pc = self.config.parallel_config
        num_experts = getattr(spec, "num_experts", None)
        if not pc.enable_expert_parallel:
            return {}
        if num_experts is None:
            logger.warning("enable_expert_parallel has no effect: %s has no experts", spec.architecture)
            return {}
        if num_experts % pc.tensor_parallel_size:
            raise ValueError(f"expert parallelism over {pc.tensor_parallel_size} devices needs num_experts "
                             f"({num_experts}) to be a multiple of it")
        return {"expert_mesh": self.mesh}


def unstack_layers(state: nnx.State) -> None:
    """Replace each stacked layer param [L, ...] in `state` by a tuple of L per-layer ones, in place, for placed
    arrays and abstract ones alike (model.layers.unstack_layers says why the CPU wants them)."""
    for variable in state["layers"].values():
        value = variable.get_value()
        variable.set_value(tuple(_layer_of(value, i) for i in range(value.shape[0])))


def _layer_of(value: jax.Array | jax.ShapeDtypeStruct, i: int) -> jax.Array | jax.ShapeDtypeStruct:
    if not isinstance(value, jax.ShapeDtypeStruct):
        return value[i]
    sharding = NamedSharding(value.sharding.mesh, PartitionSpec(*tuple(value.sharding.spec)[1:]))
    return jax.ShapeDtypeStruct(value.shape[1:], value.dtype, sharding=sharding)


def check_lora_supported(spec: DecoderSpec) -> None:
    """LoRA runs on the dense decoders and on Mixtral / Qwen3-MoE, in one process (docs/architecture/11-lora.md,
    "Mixture-of-experts models")."""
    if getattr(spec, "num_experts", None) is not None and type(spec) is not MoeSpec:
        raise ValueError(f"enable_lora: LoRA on {spec.architecture} is not supported yet (of the "
                         "mixture-of-experts models, Mixtral and Qwen3-MoE take adapters)")
    if jax.process_count() > 1:
        raise ValueError("enable_lora is not supported in a multi-host run yet")


def shard_bytes(leaf: jax.Array | jax.ShapeDtypeStruct) -> int:
    """The bytes of one device's shard of an array (all of it without a sharding)."""
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    size = 1
    for d in shape:
        size *= d
    return size * jnp.dtype(leaf.dtype).itemsize
