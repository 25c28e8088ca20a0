"""AsyncLLM: the serving engine. One background thread owns the LLMEngine; asyncio code talks to it through queues.

Threads and ownership:
- The engine thread (engine_loop.py) builds the LLMEngine (load + warm-up) and then runs the step loop. It is
  the only thread that touches the engine.
- The event loop never runs engine code. `generate()` / `abort()` append commands to an inbox under a lock that
  the engine thread holds only to swap the inbox out (never during a step), and notify it (request_registry.py).
- Each request has an asyncio.Queue on the loop that started it, filled by the engine thread (request_stream.py).

Failure model: a request-level error (bad prompt or params, too long) fails that request only, with a ValueError
on its first iteration. Any exception inside a step leaves the device state unknown: the engine is marked dead,
every in-flight request gets EngineDeadError, and so does every later generate(). Nothing ever waits forever on
a dead engine (docs/architecture/10-faults.md, "Fault policy").

Statistics go to the `stat_loggers` the engine is given (metrics/stat_logger.py); it exports nothing itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from vllm_jax.config import EngineArgs, EngineConfig, initialize_distributed
from vllm_jax.engine import engine_calls
from vllm_jax.engine.engine_loop import EngineLoop
from vllm_jax.engine.errors import EngineShutdownError
from vllm_jax.engine.llm_engine import LLMEngine, PromptType
from vllm_jax.engine.output_processor import child_request_ids
from vllm_jax.engine.request_registry import RequestRegistry
from vllm_jax.engine.request_stream import RequestStream
from vllm_jax.lora.request import LoRARequest
from vllm_jax.metrics.stat_logger import StatLogger
from vllm_jax.metrics.stats import EngineStats, RequestTimer
from vllm_jax.outputs import RequestOutput
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.structured_output import GrammarCompiler


class AsyncLLM:
    def __init__(self, config: EngineConfig, *, max_num_queued_requests: int | None = None,
                 stat_loggers: Sequence[StatLogger] = (), engine_index: int = 0,
                 engine_factory: Callable[[EngineConfig], LLMEngine] | None = None):
        """`stat_loggers` receive the engine's statistics (none: they go nowhere); `engine_index` names this
        engine to them (a data-parallel replica's rank)."""
        if max_num_queued_requests is not None and max_num_queued_requests < 0:
            raise ValueError(f"max_num_queued_requests must be >= 0; got {max_num_queued_requests}")
        self._config = config
        self._registry = RequestRegistry(max_num_queued_requests, stat_loggers, engine_index)
        factory = engine_factory or (lambda cfg: LLMEngine(cfg, show_progress=False))
        self._engine_loop = EngineLoop(config, self._registry, factory)
        self._thread: threading.Thread | None = None

    @classmethod
    def from_engine_args(cls, args: EngineArgs, **kwargs: Any) -> AsyncLLM:
        initialize_distributed(args)
        return cls(args.create_config(), **kwargs)

    # ---- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the engine thread (load, warm-up, then the step loop); returns at once."""
        if self._thread is not None:
            raise RuntimeError("AsyncLLM.start() was already called")
        self._thread = threading.Thread(target=self._engine_loop.run, name="vllm-jax-engine", daemon=True)
        self._thread.start()

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Block until warm-up finished (call it off the event loop); EngineDeadError if start-up failed."""
        if self._thread is None:
            raise RuntimeError("AsyncLLM.start() was not called")
        if not self._engine_loop.ready.wait(timeout):
            raise TimeoutError(f"the engine was not ready within {timeout} s")
        if self._registry.error is not None:
            raise self._registry.dead_error()

    async def shutdown(self, timeout: float = 0.0) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` s, abort the rest, stop the loop.

        Aborted requests end with a final output whose finish_reason is "abort".
        """
        self._registry.begin_shutdown()
        deadline = time.monotonic() + max(timeout, 0.0)
        while self._registry.in_flight() and time.monotonic() < deadline and self._loop_alive():
            await asyncio.sleep(0.02)
        unserved = self._registry.stop(engine_running=self._engine_loop.running)
        if unserved:  # still starting up: nothing will step, so fail them from here
            self._registry.fail(unserved, EngineShutdownError("the engine shut down before it was ready"))
        thread = self._thread
        if thread is not None and thread.is_alive() and self._engine_loop.running:
            await asyncio.get_running_loop().run_in_executor(None, thread.join)

    def _loop_alive(self) -> bool:
        return self._registry.error is None and self._thread is not None and self._thread.is_alive()

    # ---- state ------------------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Warm-up finished, the loop runs and new requests are accepted (False once shutdown() began)."""
        return self._engine_loop.running and self._registry.error is None and not self._registry.closing

    @property
    def shutting_down(self) -> bool:
        """shutdown() began: in-flight requests may still finish, new ones are refused."""
        return self._registry.closing

    @property
    def dead(self) -> bool:
        """The loop died or start-up failed; `error` holds the exception."""
        return self._registry.error is not None

    @property
    def error(self) -> BaseException | None:
        return self._registry.error

    @property
    def tokenizer(self) -> Any:
        """A tokenizer for the event loop's use (chat templates, /tokenize), separate from the engine thread's.

        None until loaded: it is loaded first thing on the engine thread, before the weights.
        """
        return self._engine_loop.tokenizer

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def llm_engine(self) -> LLMEngine | None:
        """The engine the thread built (None until start-up finished): read it, but only the engine thread drives
        it."""
        return self._engine_loop.engine

    @property
    def grammar_compiler(self) -> GrammarCompiler | None:
        """Compiles structured-output constraints (thread-safe, cached); None until start-up finished."""
        engine = self.llm_engine
        return engine.grammar_compiler if engine is not None else None

    @property
    def vocab_size(self) -> int:
        engine = self.llm_engine
        return engine.vocab_size if engine is not None else int(self._config.model_config.hf_config.vocab_size)

    @property
    def num_compilations(self) -> int:
        """XLA programs the engine's runner has compiled so far (0 before start-up); warm-up compiles every one a
        workload can need, so this stays put while serving."""
        engine = self.llm_engine
        return engine.runner.num_compilations if engine is not None else 0

    @property
    def fault_hook(self) -> Callable[[], None] | None:
        """Test hook: called on the engine thread at the start of every step; raising in it kills the engine."""
        return self._engine_loop.fault_hook

    @fault_hook.setter
    def fault_hook(self, hook: Callable[[], None] | None) -> None:
        self._engine_loop.fault_hook = hook

    @property
    def max_num_queued_requests(self) -> int | None:
        """New requests are refused (QueueFullError) while this many wait to be scheduled (None: no limit)."""
        return self._registry.max_num_queued_requests

    @max_num_queued_requests.setter
    def max_num_queued_requests(self, limit: int | None) -> None:
        self._registry.max_num_queued_requests = limit

    def get_stats(self) -> EngineStats:
        """The latest engine snapshot; requests submitted but not yet seen by the engine count as waiting."""
        return self._registry.snapshot()

    # ---- requests ---------------------------------------------------------------------------------------------

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams, request_id: str, *,
                       priority: int = 0, cache_salt: str | None = None,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs per `sampling_params.output_kind`.

        Rejections (ValueError for bad input, QueueFullError, EngineDeadError) come from the first iteration,
        before any output. Leaving the iteration early (break + aclose, cancellation) aborts the request.
        """
        compiler, constraint = self.grammar_compiler, sampling_params.structured_outputs
        if constraint is not None and not constraint.is_compiled and compiler is not None:
            # Compile (or find in the cache) off the engine thread, so a slow schema stalls no one else's step.
            await asyncio.to_thread(compiler.compile, constraint)
        stream = self._submit(prompt, sampling_params, request_id, priority, cache_salt, lora_request)
        done = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                yield item
                if done:
                    return
        finally:
            if not done:
                self._registry.cancel(stream)  # the consumer went away: abort, no output

    async def abort(self, request_id: str) -> None:
        """Abort a request; its generate() ends with a final output whose finish_reason is "abort"."""
        self._registry.abort(request_id)

    # ---- RL loops: pause / resume, sleep, weight updates (engine/engine_calls.py) ------------------------------

    async def pause_generation(self, mode: str = "abort") -> None:
        """Stop generating (vLLM's modes): "abort" the requests in flight, "wait" for them to finish, or "keep"
        them frozen until resume_generation(). New requests are held until then."""
        if mode not in engine_calls.PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {list(engine_calls.PAUSE_MODES)}; got {mode!r}")
        future = asyncio.get_running_loop().create_future()
        self._registry.call(lambda loop, engine, result: engine_calls.pause(loop, engine, result, mode, future))
        await future

    async def resume_generation(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self._registry.call(lambda loop, engine, result: engine_calls.resume(loop, engine, result, future))
        await future

    async def is_paused(self) -> bool:
        return await self.call_engine(lambda engine: self._engine_loop.pause_state.holds_new_requests)

    async def call_engine(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """fn(engine) on the engine thread between steps; its value, or its exception raised here."""
        future = asyncio.get_running_loop().create_future()
        self._registry.call(engine_calls.run(fn, future))
        return await future

    async def sleep(self, level: int = 1) -> None:
        await self.call_engine(lambda engine: engine.sleep(level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self.call_engine(lambda engine: engine.wake_up(tags))

    async def is_sleeping(self) -> bool:
        return await self.call_engine(lambda engine: engine.is_sleeping())

    async def update_weights(self, weights: Any) -> int:
        return await self.call_engine(lambda engine: engine.update_weights(weights))

    async def reset_prefix_cache(self) -> bool:
        return await self.call_engine(lambda engine: engine.reset_prefix_cache())

    def _submit(self, prompt: PromptType, params: SamplingParams, request_id: str, priority: int,
                cache_salt: str | None, lora_request: LoRARequest | None = None) -> RequestStream:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if self._thread is None:
            raise RuntimeError("AsyncLLM.start() was not called")
        ids = [request_id] + (child_request_ids(request_id, params.n) if params.n > 1 else [])
        stream = RequestStream(request_id=request_id, ids=ids, prompt=prompt, params=params, priority=priority,
                               cache_salt=cache_salt, arrival_wall=time.time(), loop=asyncio.get_running_loop(),
                               queue=asyncio.Queue(), timer=RequestTimer(time.monotonic(), params.n),
                               lora_request=lora_request)
        self._registry.add(stream)
        return stream
