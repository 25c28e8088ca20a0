"""The compilation manager: warm-up's plan of programs, its progress report, and the trace counter.

Before the engine reports ready, every program a workload can need is made ready: loaded from the compilation
cache, or compiled and stored (docs/architecture/05-worker.md, "Compilation and warm-up"). Every trace after that is
counted, so tests can assert that no workload compiles once warm-up is done.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np
from tqdm import tqdm

from vllm_jax.config import EngineConfig
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.multi_step.chunk import ChunkProgram
from vllm_jax.multimodal.device.encoder_step import add_empty_mm_arrays
from vllm_jax.native import float_head, float_matvec, gguf_matvec, paged_attention
from vllm_jax.sample.metadata import RowSamplingInput, build_sampling_tensors
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.worker.batch import pack_step_inputs
from vllm_jax.worker.compilation_cache import ProgramStore, count_cache_lookups
from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.warmup import WarmupPart, WarmupPlan

logger = logging.getLogger(__name__)

# (label, a row that needs the full variant, which program): the one sampling program, then the full variant's
# logits processors
_SAMPLER_PROGRAMS = (("sampler", SamplingParams(temperature=0.0), "sample"),
                     ("sampler processors", SamplingParams(temperature=0.0, repetition_penalty=1.1), "process"))


class TraceCounter:
    """Counts the traces of the device step's jitted programs: DeviceStep calls it once per trace."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@dataclass(frozen=True)
class StepShapes:
    """What fixes the programs' shapes: one (tokens, sequences) bucket pair per token bucket, and the widths."""

    buckets: list[tuple[int, int]]
    block_size: int
    max_blocks_per_seq: int
    vocab_size: int
    token_feedback: bool = False  # async scheduling: the device feeds its samples to the next step
    speculative: bool = False  # speculative decoding: every sampler verifies proposals (draft_token_ids set)
    lora: bool = False  # LoRA: the forward reads each token's adapter slot (StepInputs.lora_slots)
    mm_hidden: int = 0  # a vision-language model's width: the steps carry its M-RoPE and image-row arrays
    # Multi-step decoding (multi_step/chunk.py): K, and the largest token bucket a decode-only step can use (the
    # chunk program is compiled for the buckets up to it)
    num_scheduler_steps: int = 1
    chunk_max_tokens: int = 0
    states: bool = False  # a hybrid model: the steps carry each row's state slot (StepInputs.state_slots)


class CompilationManager:
    def __init__(self, device: DeviceStep, counter: TraceCounter, shapes: StepShapes, cache_dir: str | None,
                 parts: Sequence[WarmupPart] = (), features: object = None):
        """`parts`: the features' programs beside the step's (a speculator's, the vision encoder's); a multi-step
        engine's chunk program (`chunks`) is one too. `features`: the feature steps the engine builder made, for
        the runner (engine_builder.FeatureSteps)."""
        self.device, self.counter, self.shapes, self.cache_dir = device, counter, shapes, cache_dir
        self.features = features
        self.forwards_side_by_side = 0  # forwards made ready before the plan (compiled several at a time)
        self.chunks = (ChunkProgram(device, shapes.num_scheduler_steps, shapes.block_size, shapes.vocab_size,
                                    shapes.chunk_max_tokens)
                       if shapes.num_scheduler_steps > 1 else None)
        self.parts: list[WarmupPart] = ([self.chunks] if self.chunks is not None else []) + list(parts)

    @property
    def num_compilations(self) -> int:
        """Traces so far (one per new shape or variant of a jitted program); must not move after warm-up."""
        return self.counter.count

    def plan(self, logits_for: dict[int, jax.ShapeDtypeStruct] | None = None) -> WarmupPlan:
        """Every program a workload can need, one (label, make-it-ready) pair each, in a fixed order.

        Each token bucket's forward (with async scheduling its token-feed program), then per new sequence bucket
        the sampling program (both sampler variants, steps with and without logprobs) and the full variant's
        logits processors (with async scheduling the token-record program). Deterministic given the config, so
        every process of a multi-host run performs the same calls. `logits_for`: sequence bucket -> the
        forward's logits (abstract), which each forward records and the samplers compile for; given, the
        samplers can compile before (or without) the forwards (the KV probe's first stage, kv_budget.py)."""
        plan: WarmupPlan = []
        logits_for = {} if logits_for is None else logits_for
        sampled_buckets: set[int] = set()
        for num_tokens, num_seqs in self.shapes.buckets:
            plan.append((f"forward T={num_tokens} S={num_seqs}",
                         functools.partial(self._forward, num_tokens, num_seqs, logits_for)))
            if self.shapes.token_feedback:
                plan.append((f"token feed T={num_tokens}", functools.partial(self.device.precompile_feed, num_tokens)))
            for part in self.parts:
                plan += part.bucket_plan(self, num_tokens, num_seqs)
            if num_seqs in sampled_buckets:
                continue  # the sampler programs depend on the sequence bucket only
            sampled_buckets.add(num_seqs)
            if self.shapes.token_feedback:
                plan.append((f"token record S={num_seqs}",
                             functools.partial(self.device.precompile_record, num_seqs)))
            for name, params, program in _SAMPLER_PROGRAMS:
                plan.append((f"{name} S={num_seqs}",
                             functools.partial(self._sampler, num_seqs, params, program, logits_for)))
        if self.device.lora is not None:
            plan.append(("lora slot write", self.device.precompile_lora_write))
        for part in self.parts:
            plan += part.final_plan(self)
        return plan

    def empty_inputs(self, num_tokens: int, num_seqs: int) -> StepInputs:
        """A bucket's step inputs with no rows: what warm-up compiles each program for."""
        s = self.shapes
        inputs = pack_step_inputs([], block_size=s.block_size, max_blocks_per_seq=s.max_blocks_per_seq,
                                  num_tokens_padded=num_tokens, num_seqs_padded=num_seqs, state_slots=s.states)
        if s.lora:
            inputs.lora_slots = np.zeros(num_tokens, np.int32)
        if s.mm_hidden:
            add_empty_mm_arrays(inputs, s.mm_hidden, np.float32)
        return inputs

    def _forward(self, num_tokens: int, num_seqs: int, logits_for: dict[int, jax.ShapeDtypeStruct]) -> None:
        logits_for[num_seqs] = self.device.precompile_forward(self.empty_inputs(num_tokens, num_seqs))

    def _sampler(self, num_seqs: int, params: SamplingParams, program: str,
                 logits_for: dict[int, jax.ShapeDtypeStruct]) -> None:
        tensors, _ = build_sampling_tensors([RowSamplingInput(params, 0, [0], [], 1)], num_seqs,
                                            self.shapes.vocab_size)
        if self.shapes.speculative:
            tensors = dataclasses.replace(tensors, draft_token_ids=np.full(num_seqs, -1, np.int32))
        if num_seqs not in logits_for:  # the ahead-of-time check goes on past a forward that did not compile
            raise RuntimeError(f"not compiled: the forward of sequence bucket S={num_seqs} failed, so there are no "
                               "logits to compile this sampler for (see that forward's error)")
        if program == "sample":
            self.device.precompile_sample(logits_for[num_seqs], tensors)
        else:
            self.device.precompile_process(logits_for[num_seqs], tensors)

    def _compile_forwards_side_by_side(self) -> None:
        """The token buckets' forwards first, several compiling at once (DeviceStep.precompile_forwards); the plan
        then finds them ready. The rest of the plan (samplers, feeds, speculators) compiles in order."""
        threads = compile_threads()
        if threads < 2 or len(self.shapes.buckets) < 2:
            return
        t0 = time.perf_counter()
        ready, compiled = self.device.precompile_forwards(
            [self.empty_inputs(t, s) for t, s in self.shapes.buckets], threads)
        self.forwards_side_by_side += ready
        if compiled:
            logger.info("warm-up: %d forward programs compiled, up to %d at once, in %.1f s", compiled,
                        min(threads, compiled), time.perf_counter() - t0)

    def warmup(self, show_progress: bool = True) -> float:
        """Make every program of `plan` ready (loaded from the compilation cache, or compiled and stored); returns
        the seconds it took. Progress: a bar when `show_progress`, else a log line every few seconds."""
        t0 = time.perf_counter()
        plan = self.plan()
        if self.cache_dir:
            logger.info("warm-up: %d programs to compile, or to load from the compilation cache at %s", len(plan),
                        self.cache_dir)
        else:
            logger.info("warm-up: %d programs to compile (compilation cache off: every start compiles them)",
                        len(plan))
        store = self.device.store
        loaded_before = store.loaded if store is not None else 0
        self._compile_forwards_side_by_side()
        progress = WarmupProgress(len(plan), show_progress)
        with count_cache_lookups() as jax_cache:
            for label, make_ready in plan:
                progress.start(label)
                make_ready()
                progress.done()
            jax.block_until_ready([self.device.kv_cache] + [a for part in self.parts for a in part.device_arrays()])
        progress.close()
        if store is not None:
            store.touch_and_prune()
        seconds = time.perf_counter() - t0
        loaded = (store.loaded - loaded_before if store is not None else 0) + jax_cache.hits
        logger.info("warm-up: %d programs ready in %.1f s (%d compiled, %d loaded from the compilation cache)",
                    len(plan), seconds, len(plan) - loaded, loaded)
        return seconds


def compile_threads() -> int:
    """How many of warm-up's forward programs compile at once: $VLLM_JAX_COMPILE_THREADS, else one per CPU core
    (XLA compiles one program on about one core)."""
    value = os.environ.get("VLLM_JAX_COMPILE_THREADS")
    if value is None:
        return max(1, os.cpu_count() or 1)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"VLLM_JAX_COMPILE_THREADS must be a positive integer; got {value!r}")
    return int(value)


def program_store(config: EngineConfig, cache_dir: str | None, devices: list, state: object) -> ProgramStore | None:
    """The store of warm-up's executables, filed under everything that shapes them (None: cache off, or several
    processes, where jax's own cache is used). `state`: the (params, kv_cache) the programs run on."""
    if not cache_dir or jax.process_count() > 1:
        return None
    mc = config.model_config
    avals = jax.tree.map(lambda x: (x.shape, str(x.dtype), repr(x.sharding)), state)
    draft = config.draft_model_config
    fingerprint = [mc.hf_config.to_json_string(), draft.hf_config.to_json_string() if draft else "",
                   repr(config.speculative_config), mc.dtype, str(mc.quantization), str(mc.quantization_group_size),
                   mc.kv_cache_dtype,
                   str(mc.max_model_len),
                   str(mc.max_logprobs), repr(config.cache_config.block_size), repr(config.scheduler_config),
                   repr(config.parallel_config), config.attention_backend, config.platform, str(config.scan_layers),
                   repr([(d.id, d.device_kind) for d in devices]), repr(avals),
                   repr(config.pooler_config),  # the pooling runner's forward and pooler differ from generation's
                   _native_kernels(config)]
    return ProgramStore(cache_dir, fingerprint)


def _native_kernels(config: EngineConfig) -> str:
    """Which native kernels a CPU program calls (vllm_jax/native/: paged attention, the kept GGUF blocks' dots, the
    float linears' and a float tied head's): a program stored with them must not be loaded where they are off or
    could not be built, nor the other way."""
    if config.platform != "cpu":
        return ""
    kept = config.model_config.quantization == "gguf" and gguf_matvec.available()
    return (f"native kernels: attention {paged_attention.available()}, gguf {kept}, "
            f"float linears {float_matvec.available()}, float head {float_head.available()}")


class WarmupProgress:
    """Warm-up progress: a tqdm bar (offline use), or a log line at most every few seconds (the server's log)."""

    INTERVAL_S = 5.0

    def __init__(self, total: int, bar: bool):
        self.total, self.finished = total, 0
        self.bar = tqdm(total=total, desc="warm-up", unit="program") if bar else None
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
