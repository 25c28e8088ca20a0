"""ModelRunner: persistent per-request state, padded bucketed inputs, the device step, warm-up.

Research use, without the scheduler or the server::

    from vllm_jax import EngineArgs
    from vllm_jax.worker.model_runner import ModelRunner
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs

    runner = ModelRunner(EngineArgs(model="path/to/hf_dir").create_config())
    inputs = pack_step_inputs([RowChunk(token_ids=[1, 2, 3], num_computed=0, block_ids=[1])],
                              block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                              num_tokens_padded=8, num_seqs_padded=runner.seq_bucket(8))
    logits = runner.step(inputs)  # [S, vocab] float32; the KV cache is updated in place (donated)

The step is a pure function of (params, kv_cache, inputs); the cache is donated so XLA updates it in place.
Every token bucket's forward and every sampler variant is compiled by `warmup()`; `num_compilations` counts
traces and must not move afterwards. With several processes (multi-host), process 0 broadcasts each step's
payload and the others run `serve_worker()`, executing the same device step.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from vllm_jax.config import EngineConfig
from vllm_jax.worker.batch import RowChunk, pack_step_inputs
from vllm_jax.worker.compilation_cache import ProgramStore, count_cache_lookups, use_compilation_cache
from vllm_jax.worker.buckets import geometric_buckets, pick_bucket, seq_bucket_for
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.model.decoder import unstack_layers
from vllm_jax.worker.device_step import DeviceStep, StepPayload
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.sample.metadata import NO_LOGPROBS, RowSamplingInput, build_sampling_tensors
from vllm_jax.worker import kv_cache as kv_cache_alloc
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import ModelRunnerOutput, SchedulerOutput
from vllm_jax.sharding import check_tensor_parallel_layout, kv_cache_partition_spec, make_mesh, param_partition_spec
from vllm_jax.sharding import multihost

logger = logging.getLogger(__name__)


def _attention_backend(name: str, tensor_parallel_size: int) -> str:
    """The Pallas kernels are not wrapped in shard_map yet, and GSPMD cannot split a Pallas call over devices,
    so with tensor parallelism `auto` means the XLA attention (which GSPMD shards on the head axis)."""
    if tensor_parallel_size > 1 and name == "auto":
        logger.info("tensor_parallel_size > 1: using the xla attention backend (Pallas kernels are single-device)")
        return "xla"
    if tensor_parallel_size > 1 and name.startswith("pallas"):
        logger.warning("attention backend %s with tensor_parallel_size > 1 is untested on accelerators", name)
    return name


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int
    sampling_params: SamplingParams
    seed: int
    output_token_ids: list[int] = field(default_factory=list)


class ModelRunner:
    def __init__(self, config: EngineConfig, *, random_weights: bool = False, devices: list | None = None):
        self.config = config
        mc, cc, sc, pc = config.model_config, config.cache_config, config.scheduler_config, config.parallel_config
        self.compilation_cache_dir = use_compilation_cache(config.compilation_cache_dir)
        self.model_entry, self.spec = resolve_architecture(mc.hf_config)
        tp = pc.tensor_parallel_size
        self.mesh = make_mesh(tp, 1, pc.enable_expert_parallel, devices=devices)
        check_tensor_parallel_layout(self.spec, tp)
        source = None if random_weights else mc.source
        t0 = time.perf_counter()
        model = build_model(self.model_entry, self.spec, mc.dtype, source,
                            attention_backend=_attention_backend(config.attention_backend, tp), seed=mc.seed,
                            sharding_for=self._param_sharding, model_kwargs=self._expert_parallel_kwargs())
        self.load_seconds = time.perf_counter() - t0
        # On CPU a scan reads per-layer arrays through switched matmuls (see decoder.LayerSwitch).
        switched_scan = config.scan_layers and config.platform == "cpu" and model.switched_scan
        model.scan_layers = config.scan_layers
        graphdef, params = nnx.split(model)
        if not config.scan_layers or switched_scan:
            unstack_layers(params)
        self.vocab_size = self.spec.vocab_size
        self.block_size = cc.block_size
        self.max_blocks_per_seq = -(-mc.max_model_len // cc.block_size)
        self.max_logprobs = mc.max_logprobs

        kv_spec = kv_cache_partition_spec(self.spec, tp)
        kv_shards = tp if kv_spec != PartitionSpec() else 1
        # the budget is per device, like vLLM's: a sharded cache puts 1/tp of each block on each device
        per_block = kv_cache_alloc.bytes_per_block(self.spec.num_layers, cc.block_size, self.spec.num_kv_heads,
                                                   self.spec.head_dim, mc.kv_cache_dtype) // kv_shards
        reserve = kv_cache_alloc.activation_reserve_bytes(config, self.spec.hidden_size,
                                                          self.spec.intermediate_size, self.vocab_size)
        self.num_blocks = kv_cache_alloc.num_kv_blocks(config, per_block, reserve)
        kv_cache_alloc.check_capacity(config, self.num_blocks)
        kv_cache_alloc.log_capacity(config, self.num_blocks, per_block)
        self.kv_shape = kv_cache_alloc.KVCacheShape(self.spec.num_layers, self.num_blocks, cc.block_size,
                                                    self.spec.num_kv_heads, self.spec.head_dim, mc.kv_cache_dtype)
        kv_cache = kv_cache_alloc.allocate_kv_cache(self.kv_shape, NamedSharding(self.mesh, kv_spec))
        self.device = DeviceStep(graphdef, params, kv_cache, self.mesh, self.max_logprobs,
                                 store=self._program_store(params, kv_cache))

        self.token_buckets = geometric_buckets(sc.min_token_bucket, sc.max_num_batched_tokens, sc.bucket_growth)
        self.seq_buckets = geometric_buckets(min(sc.min_seq_bucket, sc.max_num_seqs), sc.max_num_seqs,
                                             sc.bucket_growth)
        self.requests: dict[str, CachedRequestState] = {}
        self.broadcasts = jax.process_count() > 1  # this process leads a multi-host step

    @property
    def num_compilations(self) -> int:
        return self.device.num_compilations

    @property
    def params(self) -> nnx.State:
        return self.device.params

    @property
    def kv_cache(self) -> jax.Array:
        return self.device.kv_cache

    def _expert_parallel_kwargs(self) -> dict:
        """With --enable-expert-parallel, MoE models dispatch tokens to experts sharded over the "model" axis."""
        pc = self.config.parallel_config
        num_experts = getattr(self.spec, "num_experts", None)
        if not pc.enable_expert_parallel:
            return {}
        if num_experts is None:
            logger.warning("enable_expert_parallel has no effect: %s has no experts", self.spec.architecture)
            return {}
        if num_experts % pc.tensor_parallel_size:
            raise ValueError(f"expert parallelism over {pc.tensor_parallel_size} devices needs num_experts "
                             f"({num_experts}) to be a multiple of it")
        return {"expert_mesh": self.mesh}

    def _param_sharding(self, path: tuple[str, ...], shape: tuple[int, ...]) -> NamedSharding:
        pc = self.config.parallel_config
        spec = param_partition_spec(path, shape, self.spec, pc.tensor_parallel_size, pc.enable_expert_parallel)
        return NamedSharding(self.mesh, spec)

    def seq_bucket(self, num_tokens_padded: int) -> int:
        return seq_bucket_for(num_tokens_padded, self.seq_buckets, self.config.scheduler_config.max_num_seqs)

    # --- research entry point ---
    def step(self, inputs: StepInputs) -> jax.Array:
        """Run the forward on bucket-shaped inputs; updates the KV cache; returns [S, vocab] float32 logits."""
        return self.device.forward(inputs)

    # --- engine entry point ---
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(sched)
        req_ids = list(sched.num_scheduled_tokens)
        if not req_ids:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        rows, sampling_rows, completes = [], [], []
        for rid in req_ids:
            st = self.requests[rid]
            n = sched.num_scheduled_tokens[rid]
            start = st.num_computed_tokens
            rows.append(RowChunk(st.token_ids[start:start + n], start, st.block_ids))
            completes.append(start + n >= len(st.token_ids))
            sampling_rows.append(RowSamplingInput(st.sampling_params, st.seed, st.token_ids[:st.num_prompt_tokens],
                                                  st.output_token_ids, start + n))
        num_tokens = pick_bucket(self.token_buckets, sched.total_num_scheduled_tokens)
        num_seqs = self.seq_bucket(num_tokens)
        inputs = pack_step_inputs(rows, block_size=self.block_size, max_blocks_per_seq=self.max_blocks_per_seq,
                                  num_tokens_padded=num_tokens, num_seqs_padded=num_seqs)
        tensors, _, asked = build_sampling_tensors(sampling_rows, num_seqs, self.vocab_size)
        prompt_targets, spans = self._prompt_logprob_targets(req_ids, inputs)
        payload = StepPayload(inputs, tensors, NO_LOGPROBS if asked == NO_LOGPROBS else self.max_logprobs,
                              prompt_targets)
        if self.broadcasts:
            multihost.broadcast_payload(payload)
        result = self.device.run(payload)

        out = result.sampled
        token_ids = out.token_ids.tolist()
        sampled, logprobs = [], []
        for i, rid in enumerate(req_ids):
            st = self.requests[rid]
            st.num_computed_tokens += sched.num_scheduled_tokens[rid]
            if not completes[i]:
                sampled.append([])
                logprobs.append(None)
                continue
            tok = token_ids[i]
            st.token_ids.append(tok)
            st.output_token_ids.append(tok)
            sampled.append([tok])
            n_lp = st.sampling_params.logprobs
            if n_lp is None or out.logprobs is None:
                logprobs.append(None)
            else:
                logprobs.append((out.logprob_token_ids[i, :1 + n_lp].tolist(), out.logprobs[i, :1 + n_lp].tolist(),
                                 out.ranks[i, :1 + n_lp].tolist()))
        prompt_logprobs = {}
        if result.prompt_logprobs is not None:
            ids, lps, ranks = result.prompt_logprobs
            prompt_logprobs = {rid: [(ids[j, :1 + k].tolist(), lps[j, :1 + k].tolist(), ranks[j, :1 + k].tolist())
                                     for j in range(first, first + count)] for rid, (first, count, k) in spans.items()}
        has_logprobs = any(lp is not None for lp in logprobs)
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled,
                                 logprobs=logprobs if has_logprobs else None, prompt_logprobs=prompt_logprobs)

    def _prompt_logprob_targets(self, req_ids: list[str], inputs: StepInputs):
        """For rows still in their prompt that asked for prompt_logprobs: the next prompt token at each position
        (logits at position p score the token at p + 1), and where each row's scored positions lie."""
        spans: dict[str, tuple[int, int, int]] = {}
        targets = np.zeros(inputs.input_ids.shape[0], np.int32)
        qsl = inputs.query_start_loc
        for i, rid in enumerate(req_ids):
            st = self.requests[rid]
            if st.sampling_params.prompt_logprobs is None or st.num_computed_tokens >= st.num_prompt_tokens:
                continue
            start, n = st.num_computed_tokens, int(qsl[i + 1] - qsl[i])
            count = max(0, min(start + n, st.num_prompt_tokens - 1) - start)
            targets[qsl[i]:qsl[i] + count] = st.token_ids[start + 1:start + 1 + count]
            spans[rid] = (int(qsl[i]), count, st.sampling_params.prompt_logprobs)
        return (targets if spans else None), spans

    def _update_states(self, sched: SchedulerOutput) -> None:
        for rid in sched.finished_req_ids | sched.preempted_req_ids:
            self.requests.pop(rid, None)
        for new in sched.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.token_ids), new.num_prompt_tokens, list(new.block_ids),
                new.num_computed_tokens, new.sampling_params, new.seed,
                output_token_ids=list(new.token_ids[new.num_prompt_tokens:]))
        for cached in sched.scheduled_cached_reqs:
            st = self.requests[cached.req_id]
            st.block_ids.extend(cached.new_block_ids)
            st.num_computed_tokens = cached.num_computed_tokens

    # --- multi-host ---
    def serve_worker(self) -> None:
        """Non-leader processes: run every step process 0 broadcasts, until it says stop."""
        while (payload := multihost.broadcast_payload(None)) is not None:
            self.device.run(payload)

    def stop_workers(self) -> None:
        if self.broadcasts:
            multihost.broadcast_stop()

    # --- warm-up ---
    def warmup_plan(self) -> list[tuple[str, Callable[[], object]]]:
        """Every program a workload can need, one (label, make-it-ready) pair each, in a fixed order.

        Each token bucket's forward, then per new sequence bucket the sampler variants (plain and with penalties,
        without and with logprobs). Deterministic given the config, so every process of a multi-host run performs
        the same calls."""
        plan: list[tuple[str, Callable[[], object]]] = []
        variants = [("greedy", SamplingParams(temperature=0.0)),
                    ("penalties", SamplingParams(temperature=0.0, repetition_penalty=1.1))]
        logits_for: dict[int, jax.ShapeDtypeStruct] = {}  # sequence bucket -> the forward's logits (abstract)

        def forward(num_tokens: int, num_seqs: int) -> None:
            inputs = pack_step_inputs([], block_size=self.block_size, max_blocks_per_seq=self.max_blocks_per_seq,
                                      num_tokens_padded=num_tokens, num_seqs_padded=num_seqs)
            logits_for[num_seqs] = self.device.precompile_forward(inputs)

        def sampler(num_seqs: int, params: SamplingParams, num_logprobs: int) -> None:
            tensors, _, _ = build_sampling_tensors([RowSamplingInput(params, 0, [0], [], 1)], num_seqs,
                                                   self.vocab_size)
            self.device.precompile_sample(logits_for[num_seqs], tensors, num_logprobs)

        sampled_buckets: set[int] = set()
        for num_tokens in self.token_buckets:
            num_seqs = self.seq_bucket(num_tokens)
            plan.append((f"forward T={num_tokens} S={num_seqs}", functools.partial(forward, num_tokens, num_seqs)))
            if num_seqs in sampled_buckets:
                continue  # the sampler programs depend on the sequence bucket only
            sampled_buckets.add(num_seqs)
            for name, params in variants:
                for k in (NO_LOGPROBS, self.max_logprobs):
                    plan.append((f"sampler {name} logprobs={max(k, 0)} S={num_seqs}",
                                 functools.partial(sampler, num_seqs, params, k)))
        return plan

    def warmup(self, show_progress: bool = True) -> float:
        """Make every program of `warmup_plan` ready (loaded from the compilation cache, or compiled and stored);
        returns the seconds it took.

        Progress: a bar when `show_progress`, else a log line every few seconds saying how many programs remain."""
        t0 = time.perf_counter()
        plan = self.warmup_plan()
        if self.compilation_cache_dir:
            logger.info("warm-up: %d programs to compile, or to load from the compilation cache at %s", len(plan),
                        self.compilation_cache_dir)
        else:
            logger.info("warm-up: %d programs to compile (compilation cache off: every start compiles them)",
                        len(plan))
        store = self.device.store
        loaded_before = store.loaded if store is not None else 0
        report = _WarmupReport(len(plan), show_progress)
        with count_cache_lookups() as jax_cache:
            for label, make_ready in plan:
                report.start(label)
                make_ready()
                report.done()
            jax.block_until_ready(self.kv_cache)
        report.close()
        if store is not None:
            store.touch_and_prune()
        seconds = time.perf_counter() - t0
        loaded = (store.loaded - loaded_before if store is not None else 0) + jax_cache.hits
        logger.info("warm-up: %d programs ready in %.1f s (%d compiled, %d loaded from the compilation cache)",
                    len(plan), seconds, len(plan) - loaded, loaded)
        return seconds

    def _program_store(self, params: nnx.State, kv_cache: jax.Array) -> ProgramStore | None:
        """The store of warm-up's executables, filed under everything that shapes them (None: cache off, or
        several processes, where jax's own cache is used)."""
        if not self.compilation_cache_dir or jax.process_count() > 1:
            return None
        cfg, mc = self.config, self.config.model_config
        avals = jax.tree.map(lambda x: (x.shape, str(x.dtype), repr(x.sharding)), (params, kv_cache))
        fingerprint = [mc.hf_config.to_json_string(), mc.dtype, mc.kv_cache_dtype, str(mc.max_model_len),
                       str(mc.max_logprobs), repr(cfg.cache_config.block_size), repr(cfg.scheduler_config),
                       repr(cfg.parallel_config), cfg.attention_backend, cfg.platform, str(cfg.scan_layers),
                       repr([(d.id, d.device_kind) for d in self.mesh.devices.flat]), repr(avals)]
        return ProgramStore(self.compilation_cache_dir, fingerprint)


class _WarmupReport:
    """Warm-up progress: a tqdm bar (offline use), or a log line at most every few seconds (the server's log)."""

    INTERVAL_S = 5.0

    def __init__(self, total: int, bar: bool):
        self.total, self.finished = total, 0
        self.bar = tqdm(total=total, desc="warm-up: compiling programs", unit="program") if bar else None
        self.t0 = self.last = time.perf_counter()

    def start(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)

    def done(self) -> None:
        self.finished += 1
        if self.bar is not None:
            self.bar.update(1)
            return
        now = time.perf_counter()
        if now - self.last >= self.INTERVAL_S and self.finished < self.total:
            self.last = now
            logger.info("warm-up: %d/%d programs ready, %d to go (%.0f s so far)", self.finished, self.total,
                        self.total - self.finished, now - self.t0)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
