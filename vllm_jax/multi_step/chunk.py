"""Multi-step decoding: K decode tokens per request in one jitted program (vLLM's --num-scheduler-steps).

A chunk (the scheduler's `SchedulerOutput.num_steps` > 1, see scheduler/multi_step.py) holds only decoding rows,
one token each, whose sampling needs nothing the host computes between tokens. The program loops on the device:
forward of one token per row -> sample (the basic variant, logprobs when asked) -> the KV append happens in the
forward -> stop-id and per-row limit checks -> the sampled token and the next position feed the next iteration.
A row that sampled a stop id, or reached its limit (its remaining max_tokens or the context, which the scheduler
also allocated the slots for), stops: its later iterations write the null block and their samples are not
returned. The loop ends after K iterations or when every row stopped. The host gets [K, S] tokens and each row's
count at once (docs/architecture/05-worker.md, "Several decode steps per dispatch").

Identity with K = 1: iteration j of a row samples with the row's (seed, position + j) counter, the same as the
one-token step that would sample that position; its input token, positions, slots and sequence length are what
`InputBatch.pack` would give that step.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.model.decoder import forward
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.sample.metadata import NO_LOGPROBS, build_sampling_tensors
from vllm_jax.sample.sampler import SamplingTensors, sample
from vllm_jax.scheduler.multi_step import MAX_DEVICE_STOP_IDS, device_stop_ids
from vllm_jax.scheduler.output import ModelRunnerOutput, SchedulerOutput
from vllm_jax.worker.programs import CompiledPrograms, fetch_to_host, input_signature
from vllm_jax.worker.warmup import WarmupContext, WarmupPlan

if TYPE_CHECKING:
    from vllm_jax.worker.device_step import DeviceStep
    from vllm_jax.worker.input_batch import InputBatch


class ChunkRunner(Protocol):
    """What a chunk needs of the runner (ModelRunner's public side; this module imports no runner)."""

    requests: dict[str, Any]  # req_id -> CachedRequestState
    input_batch: InputBatch
    block_size: int
    compilation: Any  # its `chunks`: the ChunkProgram

    def scheduled_rows(self, sched: SchedulerOutput) -> tuple[list[str], np.ndarray, np.ndarray, int, int]: ...


@jax.tree_util.register_dataclass
@dataclass
class ChunkLimits:
    """Per row [S]: the most tokens it samples in the chunk (0 for padding rows), and its stop ids [S, W] (-1:
    none)."""

    limits: jax.Array
    stop_ids: jax.Array


@dataclass
class ChunkResult:
    """[K, S] tokens, [S] how many each row emitted, and [K, S, 1 + max_logprobs] logprobs (None: not asked)."""

    token_ids: jax.Array | np.ndarray
    counts: jax.Array | np.ndarray
    logprobs: tuple | None = None  # (token ids, logprobs, ranks)


class ChunkProgram(CompiledPrograms):
    """The chunk's jitted program over the DeviceStep's params and donated KV cache, one per token bucket (compiled
    through the step's load_or_compile)."""

    def __init__(self, device: DeviceStep, num_steps: int, block_size: int, vocab_size: int, max_tokens: int):
        """`max_tokens`: the largest token bucket a decode-only step can use (the program is compiled for the
        buckets up to it)."""
        super().__init__(device.replicated.mesh, on_trace=device.on_trace, compile_with=device.load_or_compile)
        self.device, self.num_steps, self.block_size = device, num_steps, block_size
        self.vocab_size, self.max_tokens = vocab_size, max_tokens
        self.logprobs_width = 1 + min(max(device.max_logprobs, 0), vocab_size)  # as compute_logprobs clamps
        self._jitted = jax.jit(self._impl, donate_argnums=(1,))

    def key(self, args: tuple) -> tuple:
        return ("multistep", self.num_steps, input_signature(args))

    # --- warm-up (worker/compilation.py, WarmupPart) ---
    def bucket_plan(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> WarmupPlan:
        if num_tokens > self.max_tokens:
            return []
        return [(f"multistep K={self.num_steps} T={num_tokens} S={num_seqs}",
                 functools.partial(self._precompile_bucket, manager, num_tokens, num_seqs))]

    def final_plan(self, manager: WarmupContext) -> WarmupPlan:
        return []

    def device_arrays(self) -> list:
        return []

    def _precompile_bucket(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> None:
        tensors, _ = build_sampling_tensors([], num_seqs, self.vocab_size)
        chunk = ChunkLimits(np.zeros(num_seqs, np.int32), np.full((num_seqs, MAX_DEVICE_STOP_IDS), -1, np.int32))
        self.precompile(manager.empty_inputs(num_tokens, num_seqs), tensors, chunk)

    def precompile(self, inputs: StepInputs, tensors: SamplingTensors, chunk: ChunkLimits) -> None:
        """Warm-up: make the program for these shapes ready (loaded, or compiled and stored)."""
        dynamic = (inputs, tensors, chunk, np.array(False))
        args = (self.device.params, self.device.kv_cache, *dynamic)
        self.make_ready(self.key(dynamic), self._jitted, args, args, (0,) * 6)

    def launch(self, inputs: StepInputs, tensors: SamplingTensors, chunk: ChunkLimits,
               logprobs_on: bool) -> ChunkResult:
        dynamic = (inputs, tensors, chunk, np.array(logprobs_on))
        program = self.program(self.key(dynamic), self._jitted)
        kv_cache, token_ids, counts, *logprobs = program(self.device.params, self.device.kv_cache, *dynamic)
        self.device.kv_cache = kv_cache
        result = ChunkResult(token_ids, counts, tuple(logprobs) if logprobs_on else None)
        for leaf in jax.tree.leaves((token_ids, counts, result.logprobs)):
            if leaf.is_fully_addressable:
                leaf.copy_to_host_async()
        return result

    def _impl(self, params, kv_cache, inputs: StepInputs, tensors: SamplingTensors, chunk: ChunkLimits,
              logprobs_on):
        self.on_trace()
        num_seqs_padded, num_tokens_padded = inputs.seq_lens.shape[0], inputs.input_ids.shape[0]
        rows = jnp.arange(num_seqs_padded, dtype=jnp.int32)
        real_row = rows < inputs.num_seqs[0]
        token_row = jnp.minimum(jnp.arange(num_tokens_padded, dtype=jnp.int32), num_seqs_padded - 1)
        real_token = jnp.arange(num_tokens_padded, dtype=jnp.int32) < inputs.num_seqs[0]
        start = jnp.maximum(inputs.seq_lens - 1, 0)  # each row's input position in the first iteration
        last = jnp.maximum(chunk.limits - 1, 0)  # its last iteration
        first_ids = inputs.input_ids[jnp.minimum(rows, num_tokens_padded - 1)]
        bs, k = self.block_size, self.num_steps

        def step_inputs(j, row_ids, active):
            pos = start + jnp.minimum(j, last)  # a stopped row repeats its last position, reading valid KV
            slot = inputs.block_tables[rows, pos // bs] * bs + pos % bs
            slot = jnp.where(active, slot, 0)  # stopped and padding rows write the null block
            return dataclasses.replace(
                inputs,
                input_ids=jnp.where(real_token, row_ids[token_row], 0),
                positions=jnp.where(real_token, pos[token_row], 0),
                slot_mapping=jnp.where(real_token, slot[token_row], 0),
                seq_lens=jnp.where(real_row, pos + 1, 0))

        def body(carry):
            j, kv, row_ids, done, counts, out = carry
            active = real_row & (j < chunk.limits) & ~done
            kv, logits, *_ = forward(self.device.graphdef, params, kv, step_inputs(j, row_ids, active))
            sampled = sample(logits, dataclasses.replace(tensors, positions=tensors.positions + j),
                             self.device.max_logprobs, logprobs_on)
            token_ids = sampled.token_ids
            stopped = jnp.any(token_ids[:, None] == chunk.stop_ids, axis=-1)
            values = (token_ids, sampled.logprob_token_ids, sampled.logprobs, sampled.ranks)
            out = tuple(o.at[j].set(v) for o, v in zip(out, values))
            return (j + 1, kv, token_ids, done | (active & stopped), counts + active.astype(jnp.int32), out)

        def cond(carry):
            j, _, _, done, _, _ = carry
            return (j < k) & jnp.any(real_row & (j < chunk.limits) & ~done)

        width = self.logprobs_width
        out = (jnp.zeros((k, num_seqs_padded), jnp.int32), jnp.zeros((k, num_seqs_padded, width), jnp.int32),
               jnp.zeros((k, num_seqs_padded, width), jnp.float32), jnp.zeros((k, num_seqs_padded, width), jnp.int32))
        carry = (jnp.int32(0), kv_cache, first_ids, jnp.zeros(num_seqs_padded, jnp.bool_),
                 jnp.zeros(num_seqs_padded, jnp.int32), out)
        _, kv_cache, _, _, counts, out = jax.lax.while_loop(cond, body, carry)
        replicate = lambda x: jax.lax.with_sharding_constraint(x, self.replicated)  # noqa: E731
        return (kv_cache, replicate(out[0]), replicate(counts), *(replicate(o) for o in out[1:]))


def chunk_arrays(runner: ChunkRunner, sched: SchedulerOutput, req_ids: list[str],
                 num_seqs_padded: int) -> ChunkLimits:
    limits = np.zeros(num_seqs_padded, np.int32)
    limits[:len(req_ids)] = [sched.step_limits[r] for r in req_ids]
    stop_ids = np.full((num_seqs_padded, MAX_DEVICE_STOP_IDS), -1, np.int32)
    for i, req_id in enumerate(req_ids):
        stops = device_stop_ids(runner.requests[req_id].sampling_params)
        stop_ids[i, :len(stops)] = stops
    return ChunkLimits(limits, stop_ids)


@dataclass
class ChunkInFlight:
    """A dispatched chunk: `ModelRunner.finish` hands it to `finish_chunk`."""

    req_ids: list[str]
    slots: np.ndarray
    holders: np.ndarray
    num_logprobs: np.ndarray
    result: ChunkResult


def dispatch_chunk(runner: ChunkRunner, sched: SchedulerOutput) -> ChunkInFlight:
    """Pack the chunk's first iteration like a one-token step and launch the loop (the runner's state is
    already updated from `sched`)."""
    req_ids, slots, counts, num_tokens, num_seqs = runner.scheduled_rows(sched)
    batch = runner.input_batch
    inputs = batch.pack(slots, counts, block_size=runner.block_size, num_tokens_padded=num_tokens,
                        num_seqs_padded=num_seqs)
    tensors, asked = batch.sampling_tensors(slots, counts, num_seqs)
    chunk = chunk_arrays(runner, sched, req_ids, num_seqs)
    result = runner.compilation.chunks.launch(inputs, tensors, chunk, asked != NO_LOGPROBS)
    return ChunkInFlight(req_ids, slots, batch.holder[slots], batch.logprobs[slots], result)


def finish_chunk(runner: ChunkRunner, flight: ChunkInFlight) -> ModelRunnerOutput:
    """Each row's run of tokens (those up to and including a stop id), appended to the runner's state."""
    res = flight.result
    token_ids, counts = np.asarray(res.token_ids), np.asarray(res.counts)
    logprobs = fetch_to_host(res.logprobs) if res.logprobs is not None else None
    update = runner.input_batch.holder[flight.slots] == flight.holders
    runs: list[list[int]] = []
    row_logprobs: list = []
    for i, req_id in enumerate(flight.req_ids):
        run = token_ids[:counts[i], i].tolist()
        runs.append(run)
        if update[i]:
            runner.input_batch.append_token_run(int(flight.slots[i]), run)
            state = runner.requests[req_id]
            for token_id in run:
                state.append_sampled(token_id)
        asked = int(flight.num_logprobs[i])
        if logprobs is None or asked == NO_LOGPROBS:
            row_logprobs.append(None)
            continue
        ids, lps, ranks = logprobs
        width = 1 + asked
        row_logprobs.append([(ids[j, i, :width].tolist(), lps[j, i, :width].tolist(), ranks[j, i, :width].tolist())
                             for j in range(len(run))])
    has_logprobs = any(lp is not None for lp in row_logprobs)
    return ModelRunnerOutput(req_ids=flight.req_ids, sampled_token_ids=runs,
                             logprobs=row_logprobs if has_logprobs else None)
