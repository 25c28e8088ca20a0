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
Every token bucket's forward and every sampler variant is compiled by `warmup()` (worker/compilation.py);
`num_compilations` counts traces and must not move afterwards. With several processes (multi-host), process 0
broadcasts each step's payload and the others run `serve_worker()`, executing the same device step
(docs/architecture/01-overview.md, "Data flow of one step").
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
from flax import nnx

from vllm_jax.config import EngineConfig
from vllm_jax.lora.cache import AdapterCache
from vllm_jax.model.state_cache import HybridCache
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.multi_step.chunk import ChunkInFlight, dispatch_chunk, finish_chunk
from vllm_jax.sample.metadata import NO_LOGPROBS, build_sampling_tensors
from vllm_jax.sample.sampler import SamplingTensors
from vllm_jax.scheduler.output import ModelRunnerOutput, SchedulerOutput
from vllm_jax.sharding import multihost
from vllm_jax.spec_decode.device.proposals import (
    ChainShapes,
    broadcast_proposal,
    draft_model_proposals,
    eagle_proposals,
    follow_proposal,
    kept_tokens,
)
from vllm_jax.spec_decode.ngram import NgramProposer
from vllm_jax.spec_decode.verification import draft_token_rows
from vllm_jax.worker.buckets import pick_bucket, seq_bucket_for
from vllm_jax.worker.compilation_cache import use_compilation_cache
from vllm_jax.worker.device_step import StepResult
from vllm_jax.worker.engine_builder import MemoryProbe, build_engine
from vllm_jax.worker.input_batch import InputBatch
from vllm_jax.worker.kv_cache import num_state_slots
from vllm_jax.worker.request_state import CachedRequestState, update_request_states
from vllm_jax.worker.sleep import DeviceSleep
from vllm_jax.worker.step_output import Logprobs, plain_tokens, prompt_logprobs, row_logprobs
from vllm_jax.worker.step_payload import ProposalPayload, StepPayload
from vllm_jax.worker.weight_update import Weights, WeightUpdater, as_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class _PreparedStep:
    """One step's payload, and what turning its result into a ModelRunnerOutput needs."""

    req_ids: list[str]  # batch row order
    slots: np.ndarray  # per row: its InputBatch slot
    completes: np.ndarray  # per row (bool): its last logits sample a new token
    num_logprobs: np.ndarray  # per row: the logprobs it asked for (NO_LOGPROBS: none)
    holders: np.ndarray  # per row: InputBatch.holder of its slot when the step was prepared
    prompt_spans: dict[str, tuple[int, int, int]]  # req_id -> (first scored row, rows, top-N) of prompt logprobs
    payload: StepPayload
    num_drafts: np.ndarray | None = None  # per row: the proposals it verifies (speculative decoding), else None
    aux_hidden: jax.Array | None = None  # EAGLE-3: the target's aux hidden states of the step (on the device)


@dataclass
class InFlightStep:
    """A dispatched step: its result is still on (or coming from) the device; `ModelRunner.finish` reads it."""

    step: _PreparedStep
    result: StepResult


class ModelRunner:
    def __init__(self, config: EngineConfig, *, random_weights: bool = False, devices: list | None = None,
                 memory: MemoryProbe | None = None):
        """The engine's pieces come from worker/engine_builder.py (the construction compile-check shares);
        `memory`: how the KV budget reads the device (default: jax's statistics and a probe compile)."""
        self.config = config
        mc, sc = config.model_config, config.scheduler_config
        self.compilation_cache_dir = use_compilation_cache(config.compilation_cache_dir)
        parts = build_engine(config, devices, random_weights=random_weights)
        self.spec, self.mesh, self.attention_backend = parts.spec, parts.mesh, parts.attention_backend
        self.vocab_size = self.spec.vocab_size
        self.block_size = config.cache_config.block_size
        self.max_blocks_per_seq = parts.max_blocks_per_seq
        self.max_logprobs = mc.max_logprobs
        self.token_buckets, self.seq_buckets = parts.token_buckets, parts.seq_buckets
        self.max_rows = parts.max_rows  # the most logits rows a step holds (proposals' rows included)
        # Async scheduling: the device records every step's samples per slot and feeds them to the next step.
        self.feeds_tokens = config.async_scheduling
        # Speculative decoding: every step's sampler verifies proposals (docs/architecture/08-sampling.md, "Speculative
        # decoding"); the n-gram proposer reads the input batch's tokens after each step.
        speculative = config.speculative_config
        self.speculates = speculative is not None
        self.proposer = (NgramProposer(speculative.num_speculative_tokens, speculative.prompt_lookup_max,
                                       speculative.prompt_lookup_min)
                         if self.speculates and speculative.method == "ngram" else None)
        self.spec_disable_batch_size = speculative.disable_by_batch_size if self.speculates else None
        # A draft model or head writes its proposals' KV past each step's tokens: the scheduler allocates those
        # slots too.
        self.num_lookahead_tokens = speculative.num_speculative_tokens if parts.speculator else 0
        sizing = parts.size_kv_cache(memory or MemoryProbe())
        self.num_blocks = sizing.num_blocks
        self.compilation = parts.compilation(self.num_blocks, cache_dir=self.compilation_cache_dir,
                                             adopt_from=sizing.probe)
        self.device = self.compilation.device
        # draft_model / eagle3 speculation: the draft's or the head's programs and KV cache
        features = self.compilation.features
        self.drafter, self.eagle = features.drafter, features.eagle
        self.chain_shapes = ChainShapes(self.token_buckets, self.seq_bucket, self.block_size, mc.max_model_len)
        # LoRA: the host cache of loaded adapters (--max-cpu-loras) for the device's slots
        lora, lora_config = self.device.lora, config.lora_config
        self.lora_cache = (AdapterCache(lora_config.max_cpu_loras, lora.shapes, lora_config.max_lora_rank)
                           if lora is not None else None)
        self.requests: dict[str, CachedRequestState] = {}
        # The same requests as numpy rows, from which each step's arrays are gathered.
        self.input_batch = InputBatch(sc.max_num_seqs, mc.max_model_len, self.max_blocks_per_seq, self.vocab_size,
                                      lora=lora is not None, states=self.num_state_slots > 0)
        self.broadcasts = jax.process_count() > 1  # this process leads a multi-host step
        self.share_proposal = broadcast_proposal if self.broadcasts else None  # a draft's / head's inputs too
        # vision-language models: the encoder, its cache and the steps' image rows (multimodal/device/encoder_step.py)
        self.multimodal = features.multimodal
        if self.broadcasts and sc.num_scheduler_steps > 1:
            raise ValueError("num_scheduler_steps > 1 is not supported in a multi-host run yet")

    def load_lora_slots(self, loads: dict) -> None:
        """Write the adapters the scheduler made resident (slot -> LoRARequest) into their device slots."""
        for slot, lora_request in loads.items():
            self.device.lora.write(slot, self.lora_cache.get(lora_request))

    @property
    def num_compilations(self) -> int:
        return self.compilation.num_compilations

    @property
    def params(self) -> nnx.State:
        return self.device.params

    @property
    def kv_cache(self) -> jax.Array | HybridCache:
        return self.device.kv_cache

    @property
    def num_state_slots(self) -> int:
        """A hybrid model's state slots, the null slot included (0: no recurrent layers)."""
        return num_state_slots(self.config) if self.spec.state_layout is not None else 0

    # --- weight updates and sleep mode (docs/architecture/05-worker.md, "Sleep and weight updates") ---
    def update_weights(self, weights: Weights) -> int:
        """Swap in HF-named tensors (or a checkpoint's) in place, on the params' shardings; returns the arrays
        swapped. Nothing recompiles."""
        if self.broadcasts:
            raise ValueError("update_weights is not supported in a multi-host run yet")
        updater = WeightUpdater(self.params, self.spec, self.config.model_config, self.sleep_mode.borrowed)
        swapped = updater.update(as_checkpoint(weights))
        if not self.sleep_mode.asleep:  # an EAGLE-3 head reading the target's embedding reads the new one
            self.sleep_mode.follow_target_embedding()
        return swapped

    @functools.cached_property
    def sleep_mode(self) -> DeviceSleep:
        return DeviceSleep(self.device, self.drafter or self.eagle)

    def seq_bucket(self, num_tokens_padded: int) -> int:
        return seq_bucket_for(num_tokens_padded, self.seq_buckets, self.max_rows)

    # --- research entry point ---
    def step(self, inputs: StepInputs) -> jax.Array:
        """Run the forward on bucket-shaped inputs; updates the KV cache; returns [S, vocab] float32 logits."""
        return self.device.forward(inputs)

    # --- engine entry point ---
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """One step, start to finish."""
        return self.finish(self.dispatch(sched))

    def dispatch(self, sched: SchedulerOutput) -> InFlightStep | ChunkInFlight | None:
        """Apply the scheduler's changes and launch the step on the device without waiting for it (None: nothing
        scheduled). Async scheduling dispatches step n + 1 before finishing step n."""
        update_request_states(self.requests, sched)
        if self.multimodal is not None:
            self.multimodal.update(sched)
        self.input_batch.update(sched)
        if sched.lora_loads:
            self.load_lora_slots(sched.lora_loads)
        if not sched.num_scheduled_tokens:
            return None
        if sched.num_steps > 1:  # docs/architecture/05-worker.md, "Several decode steps per dispatch"
            return dispatch_chunk(self, sched)
        step = self._prepare(sched)
        flight = InFlightStep(step, self._launch(step.payload))
        step.aux_hidden = self.device.aux_hidden
        return flight

    def finish(self, flight: InFlightStep | ChunkInFlight | None) -> ModelRunnerOutput:
        """Wait for a dispatched step's result and report it."""
        if flight is None:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        if isinstance(flight, ChunkInFlight):
            return finish_chunk(self, flight)
        return self._to_output(flight.step, self.device.fetch(flight.result))

    def scheduled_rows(self, sched: SchedulerOutput) -> tuple[list[str], np.ndarray, np.ndarray, int, int]:
        """The scheduled requests, their input-batch slots and token counts, and the (tokens, sequences) bucket
        that holds them."""
        req_ids = list(sched.num_scheduled_tokens)
        slots = self.input_batch.slots(req_ids)
        counts = np.fromiter(sched.num_scheduled_tokens.values(), np.int32, len(req_ids))
        num_tokens = pick_bucket(self.token_buckets, sched.total_num_scheduled_tokens)
        return req_ids, slots, counts, num_tokens, self.seq_bucket(num_tokens)

    def _prepare(self, sched: SchedulerOutput) -> _PreparedStep:
        """The scheduled rows packed into the smallest bucket that holds them, with their sampling tensors."""
        req_ids, slots, counts, num_tokens, num_seqs = self.scheduled_rows(sched)
        batch = self.input_batch
        num_drafts, drafts = None, sched.scheduled_spec_decode_tokens
        if self.speculates:
            num_drafts = np.fromiter((len(drafts.get(r, ())) for r in req_ids), np.int32, len(req_ids))
            if drafts:
                batch.write_drafts(slots, [drafts.get(r, ()) for r in req_ids])
        inputs = batch.pack(slots, counts, block_size=self.block_size, num_tokens_padded=num_tokens,
                            num_seqs_padded=num_seqs, num_drafts=num_drafts)
        if self.multimodal is not None:
            self.multimodal.fill(inputs, req_ids)
        # The common case reads only the rows; the per-request Python state only where some row needs it.
        full = bool(sched.grammar_bitmask) or bool(batch.may_need_full[slots].any())
        scores_prompt = bool(batch.wants_prompt_logprobs[slots].any())
        states = [self.requests[req_id] for req_id in req_ids] if full or scores_prompt else []
        if full:
            tensors, asked = self._full_sampling_tensors(sched, states, counts.tolist(), num_seqs, num_drafts)
        else:
            tensors, asked = batch.sampling_tensors(slots, counts, num_seqs, num_drafts)
        if num_drafts is not None:
            tensors = dataclasses.replace(tensors, draft_token_ids=draft_token_rows(req_ids, drafts, num_drafts,
                                                                               num_seqs))
        prompt_targets, spans = self._prompt_logprob_targets(states, inputs) if scores_prompt else (None, {})
        # One logprobs width for every step that asks for any, so the sampler compiles two variants, not one per K.
        num_logprobs = NO_LOGPROBS if asked == NO_LOGPROBS else self.max_logprobs
        payload = StepPayload(inputs, tensors, num_logprobs, prompt_targets,
                              input_token_slots=batch.pending_token_slots(slots, counts, inputs, num_drafts))
        if self.feeds_tokens:
            payload.sample_slots = np.full(num_seqs, batch.num_slots, np.int32)  # padding rows: the spare slot
            payload.sample_slots[:len(slots)] = slots
        elif payload.input_token_slots is not None:
            raise RuntimeError("a step needs a token still being sampled, but async scheduling is off")
        return _PreparedStep(req_ids, slots, batch.completes(slots, counts), batch.logprobs[slots],
                             batch.holder[slots], spans, payload,
                             num_drafts if num_drafts is not None and num_drafts.any() else None)

    def _full_sampling_tensors(self, sched: SchedulerOutput, states: list[CachedRequestState], counts: list[int],
                               num_seqs: int, num_drafts: np.ndarray | None) -> tuple[SamplingTensors, int]:
        """Every logits row's sampling input, for a step where some row may need the full variant (metadata
        decides). A row verifying proposals has one logits row per position, each sampling as if the proposals
        before it were outputs (penalties' counts, bad words, min_tokens) under its own grammar row, so
        verification is exact."""
        rows = []
        for i, (state, n) in enumerate(zip(states, counts)):
            num_draft = 0 if num_drafts is None else int(num_drafts[i])
            drafts = sched.scheduled_spec_decode_tokens.get(state.req_id, [])
            masks = sched.grammar_bitmask.get(state.req_id)
            for j in range(num_draft + 1):
                row = state.sampling_input(n - num_draft + j, drafts[:j])
                row.token_bitmask = None if masks is None else masks[j]
                rows.append(row)
        return build_sampling_tensors(rows, num_seqs, self.vocab_size)

    def _launch(self, payload: StepPayload) -> StepResult:
        if self.broadcasts:
            multihost.broadcast_bytes(payload.to_bytes())
        result = self.device.launch(payload)
        if self.drafter is not None:  # the draft's KV for the same tokens (its chain runs once they are known)
            self.drafter.catch_up(payload.inputs)
        return result

    def _to_output(self, step: _PreparedStep, result: StepResult) -> ModelRunnerOutput:
        """Report each row's sampled tokens and logprobs, and advance the state of the rows the runner still holds.

        Under async scheduling the next step was dispatched first, so a row's request may have left meanwhile
        (finished, aborted or preempted) and its slot may hold another request: such rows update nothing here,
        but their tokens are still reported (a preempted request keeps the token; the scheduler drops the
        others'). The state's num_computed_tokens is not advanced here: the next SchedulerOutput sets it."""
        update = step.completes & (self.input_batch.holder[step.slots] == step.holders)
        if step.num_drafts is None:
            sampled, logprobs = self._single_tokens(step, result, update)
        else:
            sampled, logprobs = self._verified_tokens(step, result, update)
        has_logprobs = any(lp is not None for lp in logprobs)
        out = ModelRunnerOutput(req_ids=step.req_ids, sampled_token_ids=sampled,
                                logprobs=logprobs if has_logprobs else None,
                                prompt_logprobs=prompt_logprobs(result.prompt_logprobs, step.prompt_spans))
        if self.speculates:
            out.draft_token_ids = self._propose(step, update, sampled)
        return out

    def _single_tokens(self, step: _PreparedStep, result: StepResult,
                       update: np.ndarray) -> tuple[list[list[int]], list[list[Logprobs] | None]]:
        """One token per row (logits row i is batch row i): the common step."""
        token_ids = result.sampled.token_ids[:len(step.req_ids)]
        self.input_batch.append_tokens(step.slots[update], token_ids[update])
        if result.sampled.logprobs is None and step.completes.all():  # the common step, without a row loop
            return plain_tokens(self.requests, step.req_ids, token_ids.tolist(), update.tolist())
        sampled: list[list[int]] = []
        logprobs: list[list[Logprobs] | None] = []
        rows = zip(step.req_ids, step.completes.tolist(), update.tolist(), token_ids.tolist(),
                   step.num_logprobs.tolist())
        for i, (req_id, completes, updates, token_id, num_logprobs) in enumerate(rows):
            if not completes:  # a prompt chunk short of the prompt's end samples nothing
                sampled.append([])
                logprobs.append(None)
                continue
            sampled.append([token_id])
            if updates:
                self.requests[req_id].append_sampled(token_id)
            row = row_logprobs(result.sampled, i, None if num_logprobs == NO_LOGPROBS else num_logprobs)
            logprobs.append(None if row is None else [row])
        return sampled, logprobs

    def _verified_tokens(self, step: _PreparedStep, result: StepResult,
                         update: np.ndarray) -> tuple[list[list[int]], list[list[Logprobs] | None]]:
        """Speculative decoding: a row verifying d proposals owns d + 1 logits rows; it yields its accepted
        proposals (the leading accepted rows) and the token of the first row after them."""
        num_rows = step.num_drafts + 1
        starts = (np.cumsum(num_rows) - num_rows).tolist()
        token_ids = result.sampled.token_ids.tolist()
        accepted = result.sampled.accepted.tolist()
        sampled: list[list[int]] = []
        logprobs: list[list[Logprobs] | None] = []
        rows = zip(step.req_ids, step.slots.tolist(), step.completes.tolist(), update.tolist(), starts,
                   step.num_drafts.tolist(), step.num_logprobs.tolist())
        for req_id, slot, completes, updates, start, num_draft, num_logprobs in rows:
            if not completes:
                sampled.append([])
                logprobs.append(None)
                continue
            num_accepted = 0
            while num_accepted < num_draft and accepted[start + num_accepted]:
                num_accepted += 1
            run = token_ids[start:start + num_accepted + 1]
            sampled.append(run)
            if updates:
                self.input_batch.append_token_run(slot, run)
                state = self.requests[req_id]
                for token_id in run:
                    state.append_sampled(token_id)
            asked = None if num_logprobs == NO_LOGPROBS else num_logprobs
            rows_lp = [row_logprobs(result.sampled, start + j, asked) for j in range(len(run))]
            logprobs.append(None if asked is None or result.sampled.logprobs is None else rows_lp)
        return sampled, logprobs

    def _propose(self, step: _PreparedStep, update: np.ndarray, sampled: list[list[int]]) -> dict[str, list[int]]:
        """Proposals (n-gram, the draft model's or the EAGLE-3 head's) for the next step of each decoding row,
        from the input batch's tokens (none while more rows run than disable_by_batch_size allows). The EAGLE-3
        head catches up on every step's tokens even then."""
        limit = self.spec_disable_batch_size
        proposing = update & (limit is None or len(step.req_ids) <= limit)
        if self.eagle is not None:
            kept = kept_tokens(step.payload.inputs.query_start_loc, len(step.req_ids), step.num_drafts,
                               step.completes, sampled)
            proposals = eagle_proposals(self.eagle, self.input_batch, step.slots, step.payload.inputs, kept,
                                        proposing, step.aux_hidden, self.chain_shapes, self.share_proposal)
            return {req_id: p.tolist() for req_id, p in zip(step.req_ids, proposals) if len(p)}
        rows = np.flatnonzero(proposing)
        slots = step.slots[rows]
        if not len(slots):
            return {}
        if self.drafter is not None:
            proposals = draft_model_proposals(self.drafter, self.input_batch, slots, self.chain_shapes,
                                              self.share_proposal)
        else:
            batch = self.input_batch
            proposals = self.proposer.propose_rows(batch.token_ids[slots], batch.num_tokens[slots])
        return {step.req_ids[i]: p.tolist() for i, p in zip(rows.tolist(), proposals) if len(p)}

    def _prompt_logprob_targets(self, states: list[CachedRequestState], inputs: StepInputs):
        """For rows still in their prompt that asked for prompt_logprobs: the next prompt token at each position
        (logits at position p score the token at p + 1), and where each row's scored positions lie."""
        spans: dict[str, tuple[int, int, int]] = {}
        targets = np.zeros(inputs.input_ids.shape[0], np.int32)
        qsl = inputs.query_start_loc
        for i, st in enumerate(states):
            if st.sampling_params.prompt_logprobs is None or st.num_computed_tokens >= st.num_prompt_tokens:
                continue
            start, n = st.num_computed_tokens, int(qsl[i + 1] - qsl[i])
            count = max(0, min(start + n, st.num_prompt_tokens - 1) - start)
            targets[qsl[i]:qsl[i] + count] = st.token_ids[start + 1:start + 1 + count]
            spans[st.req_id] = (int(qsl[i]), count, st.sampling_params.prompt_logprobs)
        return (targets if spans else None), spans

    # --- multi-host ---
    def serve_worker(self) -> None:
        """Non-leader processes: run every step process 0 broadcasts (and the draft's or head's proposal steps),
        until it says stop."""
        while (data := multihost.broadcast_bytes(None)) is not None:
            if ProposalPayload.is_proposal(data):
                follow_proposal(ProposalPayload.from_bytes(data), self.drafter, self.eagle, self.device.aux_hidden)
                continue
            # Launched, never read: waiting here would hold the next broadcast until this step is done.
            payload = StepPayload.from_bytes(data)
            self.device.launch(payload)
            if self.drafter is not None:  # as process 0's _launch
                self.drafter.catch_up(payload.inputs)

    def stop_workers(self) -> None:
        if self.broadcasts:
            multihost.broadcast_stop()

    # --- warm-up (worker/compilation.py) ---
    def warmup_plan(self) -> list[tuple[str, Callable[[], object]]]:
        return self.compilation.plan()

    def warmup(self, show_progress: bool = True) -> float:
        """Make every program a workload can need ready; returns the seconds it took."""
        return self.compilation.warmup(show_progress)
