"""LLMEngine: the step loop (schedule -> run the jitted step -> update -> detokenize).

With async scheduling (`EngineConfig.async_scheduling`, vLLM's `--async-scheduling`) each step() schedules and
dispatches step n + 1 before it waits for step n, so the host's scheduling, input preparation, stop checks and
detokenization overlap the device's work (docs/architecture/02-engine.md, "Async scheduling").

It owns the tokenizer, the scheduler with its KV-cache manager, the model runner and the output processor.
Prompt handling (text, token ids, chat), sampling-param checks that need the model (vocab, max_logprobs),
n > 1 fan-out and request seeds happen here, before anything reaches the scheduler.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm_jax.config import EngineArgs, EngineConfig, initialize_distributed
from vllm_jax.engine.errors import EngineSleepingError
from vllm_jax.engine.output_processor import OutputProcessor, child_request_ids
from vllm_jax.lora.request import LoRARequest
from vllm_jax.lora.slots import LoRASlots
from vllm_jax.model_loader.tokenizer import generation_eos_token_ids, load_tokenizer
from vllm_jax.multimodal.requests import ImagePrompts, image_refusal
from vllm_jax.outputs import RequestOutput
from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
from vllm_jax.pooling.device.runner import runner_class
from vllm_jax.pooling.requests import attach_pooler_outputs, check_pooling_request
from vllm_jax.reasoning import get_reasoning_parser
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import EngineCoreOutput, SchedulerOutput
from vllm_jax.scheduler.request import Request, RequestStatus
from vllm_jax.scheduler.scheduler import Scheduler
from vllm_jax.structured_output import GrammarCompiler, ReasoningTokens, RequestGrammar
from vllm_jax.utils import bitmask_width
from vllm_jax.worker.model_runner import InFlightStep
from vllm_jax.worker.weight_update import Weights

logger = logging.getLogger(__name__)

PromptType = str | list[int] | dict


@dataclass
class StepRecord:
    """What the latest step() call scheduled (the steps it dispatched) and produced per request (for stats;
    RequestOutputs lack it). Under async scheduling the outputs are those of the step dispatched one call
    earlier."""

    scheduled: list[SchedulerOutput]
    core_outputs: list[EngineCoreOutput]
    num_finished_tokens: int = 0  # the tokens of the step whose result this call read

    @property
    def made_progress(self) -> bool:
        return self.num_finished_tokens > 0 or self.num_scheduled_tokens > 0

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.total_num_scheduled_tokens for s in self.scheduled)


@dataclass
class _Dispatched:
    """A step on the device: what was scheduled, and the runner's handle to its result."""

    scheduled: SchedulerOutput
    flight: InFlightStep | None


class LLMEngine:
    def __init__(self, config: EngineConfig, *, warmup: bool = True, show_progress: bool = True,
                 devices: list | None = None):
        """`devices`: the slice of devices this engine's mesh uses (a data-parallel replica); default: the first
        tensor_parallel_size devices."""
        self.config = config
        mc = config.model_config
        self.tokenizer = load_tokenizer(mc)
        self.runner = runner_class(config)(config, devices=devices)
        self.image_prompts = ImagePrompts(self.runner.spec, mc.source.path,
                                          image_refusal(config, getattr(self.runner, "broadcasts", False)))
        self.vocab_size = self.runner.vocab_size
        self.kv_cache_manager = KVCacheManager(self.runner.num_blocks, config.cache_config.block_size,
                                               config.cache_config.enable_prefix_caching, mc.max_model_len,
                                               self.runner.num_state_slots)
        speculative = config.speculative_config
        self.scheduler = Scheduler(config.scheduler_config, self.kv_cache_manager, config.cache_config.block_size,
                                   num_spec_tokens=speculative.num_speculative_tokens if speculative else 0,
                                   spec_disable_batch_size=speculative.disable_by_batch_size if speculative else None,
                                   num_lookahead_tokens=self.runner.num_lookahead_tokens,
                                   lora_slots=LoRASlots(config.lora_config.max_loras) if config.lora_config else None)
        self.output_processor = OutputProcessor(self.tokenizer)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_id = eos if eos is not None else getattr(mc.hf_config, "eos_token_id", None)
        if isinstance(self.eos_token_id, list):
            self.eos_token_id = self.eos_token_id[0] if self.eos_token_id else None
        self.extra_stop_ids = generation_eos_token_ids(mc) - {self.eos_token_id}
        so = config.structured_outputs_config
        self.grammar_compiler = GrammarCompiler(self.tokenizer, self.vocab_size,
                                                {self.eos_token_id, *self.extra_stop_ids},
                                                disable_any_whitespace=so.disable_any_whitespace,
                                                disable_additional_properties=so.closes_objects)
        self.reasoning_tokens = reasoning_tokens(self.tokenizer, config.reasoning_parser)
        self._seed_rng = random.Random(mc.seed)
        self.async_scheduling = config.async_scheduling
        self._in_flight: _Dispatched | None = None  # async scheduling: the step whose result is not read yet
        self.last_step: StepRecord | None = None
        self._lora_names: dict[int, str] = {}  # LoRA adapter id -> its name, as first seen
        self.warmup_seconds = self.runner.warmup(show_progress) if warmup else 0.0

    @classmethod
    def from_engine_args(cls, args: EngineArgs, **kwargs: Any) -> LLMEngine:
        initialize_distributed(args)
        return cls(args.create_config(), **kwargs)

    # --- requests ---
    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0, cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        if self.is_sleeping():
            raise EngineSleepingError("the engine is sleeping: call wake_up() before generating")
        params = params.clone() if params is not None else SamplingParams()
        text, token_ids = self._tokenize_prompt(prompt)
        token_ids, mm_inputs = self.image_prompts.prepare(prompt, token_ids)
        token_ids = check_pooling_request(self.config, params, token_ids, self.runner.spec.hidden_size)
        self._check_params(params)
        self._check_lora(lora_request)
        arrival = time.time() if arrival_time is None else arrival_time
        n = params.n
        child_ids = child_request_ids(request_id, n) if n > 1 else [request_id]
        base_seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        requests = [Request(request_id=cid, prompt_token_ids=token_ids, sampling_params=params,
                            eos_token_id=self.eos_token_id, arrival_time=arrival, seed=base_seed + i,
                            priority=priority, cache_salt=cache_salt, grammar=self._new_grammar(params, token_ids),
                            needs_host_tokens=params.reads_output_tokens, lora_request=lora_request,
                            mm_inputs=mm_inputs)
                    for i, cid in enumerate(child_ids)]
        added: list[str] = []
        try:
            for req in requests:
                self.scheduler.add_request(req)
                added.append(req.request_id)
            self.output_processor.add_request(request_id, text, token_ids, params, arrival,
                                              child_ids if n > 1 else None)
        except Exception:  # a refused request leaves nothing behind
            self.scheduler.finish_requests(added, RequestStatus.FINISHED_ABORTED)
            raise

    def _check_lora(self, lora_request: LoRARequest | None) -> None:
        """A request's adapter is read and checked at arrival (into the host cache), so a bad one is refused
        here (ValueError) and never reaches a device slot."""
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest; got {type(lora_request).__name__}")
        if self.runner.lora_cache is None:
            raise ValueError("lora_request given, but LoRA is not enabled: start the engine with enable_lora=True")
        # An id names one adapter for the engine's life: slots and prefix-cache keys go by the id.
        known = self._lora_names.get(lora_request.lora_int_id)
        if known is not None and known != lora_request.lora_name:
            raise ValueError(f"lora_int_id {lora_request.lora_int_id} is adapter {known!r}, not "
                             f"{lora_request.lora_name!r}")
        self.runner.lora_cache.get(lora_request)
        self._lora_names[lora_request.lora_int_id] = lora_request.lora_name

    def abort_request(self, request_ids: str | Iterable[str]) -> list[RequestOutput]:
        """Abort requests (parent or child ids); returns the final output of each running request aborted by its
        parent id (finish_reason "abort", shaped by its output kind)."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        finals = [out for rid in ids if (out := self.output_processor.aborted_output(rid)) is not None]
        child_ids = self.output_processor.abort_requests(ids)
        self.scheduler.finish_requests(child_ids, RequestStatus.FINISHED_ABORTED)
        return finals

    def num_prompt_tokens(self, request_id: str) -> int:
        """The prompt length of a running request, as tokenized."""
        return self.output_processor.num_prompt_tokens(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self.output_processor.has_unfinished_requests()

    def has_work(self) -> bool:
        """Something for step() to do: unfinished requests, a step still in flight, or finished requests whose
        ids the runner has not been told yet (one more, empty step drops their state)."""
        return (self.has_unfinished_requests() or self._in_flight is not None
                or self.scheduler.has_finished_requests())

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    # --- the step ---
    def step(self) -> list[RequestOutput]:
        """One step's outputs. Synchronous: schedule, run, update. Async: dispatch the next step (unless some
        running request needs this step's tokens on the host first), then finish the one in flight."""
        if not self.async_scheduling:
            dispatched = self._dispatch()
            return self._finish(dispatched, [dispatched.scheduled])
        scheduled: list[SchedulerOutput] = []
        if self._in_flight is None:
            self._in_flight = self._dispatch()
            scheduled.append(self._in_flight.scheduled)
        ahead = None
        if self._in_flight.flight is not None and not self._waits_for_host():
            ahead = self._dispatch()
            scheduled.append(ahead.scheduled)
            if ahead.flight is None:  # nothing to run (the runner has taken the finished ids already)
                ahead = None
        current, self._in_flight = self._in_flight, ahead
        return self._finish(current, scheduled)

    def _dispatch(self) -> _Dispatched:
        sched_out = self.scheduler.schedule()
        return _Dispatched(sched_out, self.runner.dispatch(sched_out))

    def _waits_for_host(self) -> bool:
        """Whether the next step must wait for the one in flight: a running request's next inputs need its
        newest token on the host (structured outputs, penalties, bad words, min_tokens), nobody could be
        scheduled anyway, or a multi-step chunk is in flight or could come next (its requests' tokens must be on
        the host: docs/architecture/02-engine.md, "Multi-step decoding and async scheduling")."""
        running = self.scheduler.running
        return (not (running or self.scheduler.waiting) or any(r.needs_host_tokens for r in running)
                or self._in_flight.scheduled.num_steps > 1 or self.scheduler.next_step_may_chunk())

    def _finish(self, dispatched: _Dispatched, scheduled: list[SchedulerOutput]) -> list[RequestOutput]:
        runner_out = self.runner.finish(dispatched.flight)
        core_outputs = self.scheduler.update_from_output(dispatched.scheduled, runner_out)
        self.last_step = StepRecord(scheduled, core_outputs, dispatched.scheduled.total_num_scheduled_tokens)
        processed = self.output_processor.process_outputs(core_outputs)
        if runner_out.pooler_output:
            attach_pooler_outputs(processed.request_outputs, runner_out.pooler_output)
        if processed.reqs_to_abort:
            self.scheduler.finish_requests(processed.reqs_to_abort, RequestStatus.FINISHED_STOPPED)
        if self._in_flight is None and not self.scheduler.has_unfinished_requests():
            # Idle from now on: an empty schedule hands the runner the finished ids so it drops their state.
            self.runner.execute(self.scheduler.schedule())
        return processed.request_outputs

    def shutdown(self) -> None:
        """Release the other processes of a multi-host engine (no-op on one process)."""
        self.runner.stop_workers()

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    # --- RL loops: weight updates and sleep mode (docs/architecture/05-worker.md, "Sleep and weight updates") ---
    def update_weights(self, weights: Weights) -> int:
        """vLLM's load_weights: HF-named (name, array) pairs or a checkpoint path, swapped in place (nothing
        recompiles); the prefix cache is reset. Returns the arrays swapped."""
        swapped = self.runner.update_weights(weights)
        if not self.reset_prefix_cache():
            logger.warning("update_weights: the prefix cache could not be reset while requests hold blocks")
        return swapped

    def sleep(self, level: int = 1) -> None:
        """Free the devices' weights (level 1: kept in host memory; 2: dropped) and KV cache. Refused with
        requests in flight (vLLM's waits; here the caller aborts or drains them first)."""
        if not self.config.enable_sleep_mode:
            raise ValueError("sleep needs the engine started with enable_sleep_mode=True (--enable-sleep-mode)")
        if self.runner.broadcasts:
            raise ValueError("sleep is not supported in a multi-host run yet")
        if self.has_unfinished_requests() or self._in_flight is not None:
            raise RuntimeError(f"cannot sleep with {self.get_num_unfinished_requests()} request(s) in flight: "
                               "let them finish or abort them first")
        self.runner.sleep_mode.sleep(level)
        self.reset_prefix_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore the weights and / or the KV cache (tags "weights", "kv_cache"; default both)."""
        self.runner.sleep_mode.wake_up(tags)
        self.reset_prefix_cache()

    def is_sleeping(self) -> bool:
        return bool(self.runner.sleep_mode.asleep)

    # --- input checks ---
    def _tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:5]}")
            return None, list(prompt)
        raise TypeError(f"prompt must be a string, a list of token ids or a dict; got {type(prompt).__name__}")

    def _check_params(self, params: SamplingParams) -> None:
        max_lp = self.config.model_config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > max_lp:
                raise ValueError(f"{name}={value} exceeds max_logprobs={max_lp}")
        params.verify_token_ids(self.vocab_size)
        if not params.ignore_eos and self.extra_stop_ids:
            params.stop_token_ids = sorted(set(params.stop_token_ids or []) | self.extra_stop_ids)
        if params.bad_words:
            params.bad_words_token_ids = self._bad_words_ids(params.bad_words)
        params.all_stop_token_ids = set(params.stop_token_ids or []) | (
            {self.eos_token_id} if self.eos_token_id is not None else set())

    def _new_grammar(self, params: SamplingParams, prompt_token_ids: list[int]) -> RequestGrammar | None:
        """A fresh matcher for one (child) request; the grammar itself is compiled once (usually before the
        request reached this thread: AsyncLLM and the server compile off the engine thread)."""
        if params.structured_outputs is None:
            return None
        grammar = self.grammar_compiler.compile(params.structured_outputs)
        return RequestGrammar(self.grammar_compiler.new_matcher(grammar), bitmask_width(self.vocab_size),
                              self.grammar_compiler.stop_token_ids, self.reasoning_tokens, prompt_token_ids)

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word as it tokenizes alone and after a space (vLLM bans both spellings)."""
        out: list[list[int]] = []
        for word in words:
            for variant in (word.lstrip(), " " + word.lstrip()):
                ids = list(self.tokenizer.encode(variant, add_special_tokens=False))
                if ids and ids not in out:
                    out.append(ids)
        return out


def reasoning_tokens(tokenizer: Any, parser_name: str | None) -> ReasoningTokens | None:
    """The reasoning parser's tags as token ids, for the structured-output gate (docs/architecture/08-sampling.md,
    "Structured outputs"). A tokenizer without a single-token end tag cannot gate: the constraint then starts at
    the first token (the server still reads the reasoning only up to the end tag), and the log says so."""
    if parser_name is None:
        return None
    parser = get_reasoning_parser(parser_name)
    vocab = tokenizer.get_vocab()
    end_id = vocab.get(parser.end_token)
    if end_id is None:
        logger.warning("--reasoning-parser %s: the tokenizer has no %r token, so structured outputs constrain "
                       "from the first token rather than after the reasoning", parser_name, parser.end_token)
        return None
    return ReasoningTokens(start_id=vocab.get(parser.start_token), end_id=end_id)
