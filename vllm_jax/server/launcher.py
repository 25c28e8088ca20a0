"""Run the app under uvicorn next to the engine: the lifecycle behind `vllm-jax serve` (and the tests' servers).

Order matters for users and load balancers: uvicorn listens at once, so /health answers 503 while the engine
loads and compiles; the engine starts in its background thread; the URL is printed only when the engine is
ready. If the engine fails to start, the server stops and `serve()` returns 1.

On SIGINT/SIGTERM (or `request_exit()`) the server drains: uvicorn closes the listening socket (new connections are
refused) and the engine stops accepting requests (503 on connections still open), lets the in-flight ones finish
for up to `shutdown_timeout` seconds, then ends the rest with finish_reason "abort" — a last chunk and [DONE] for a
stream, a normal body for the others — so no response is cut off. uvicorn waits for those responses a little
longer (`_FLUSH_GRACE_S`) before it cancels what is left; then the process exits with code 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI

from vllm_jax.server.tool_parsers import auto_tool_parser

if TYPE_CHECKING:
    from vllm_jax.engine.async_llm import AsyncLLM

logger = logging.getLogger("vllm_jax.server")

# Past --shutdown-timeout, how long uvicorn still waits for the responses the engine ended with "abort" to be sent.
_FLUSH_GRACE_S = 2.0


class _Server(uvicorn.Server):
    """uvicorn's server, except that a handled SIGTERM/SIGINT ends in a clean return (exit code 0).

    uvicorn re-raises the signal once it has shut down, which would kill the process before the engine is shut
    down (SIGTERM) or end in a KeyboardInterrupt traceback (Ctrl-C). A second Ctrl-C still forces the exit.
    """

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, drain_timeout: float):
        super().__init__(config)
        self.engine, self.drain_timeout = engine, drain_timeout
        self._drain: asyncio.Future | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    def drain_engine(self) -> asyncio.Future:
        """Start (once) the engine's shutdown: finish in-flight requests for up to drain_timeout s, abort the rest."""
        if self._drain is None:
            self._drain = asyncio.ensure_future(self.engine.shutdown(timeout=self.drain_timeout))
        return self._drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain_engine()  # runs while uvicorn waits for the open connections
        await super().shutdown(sockets)


class HttpServer:
    """One uvicorn server and the engine it serves; `serve()` runs both until asked to exit."""

    def __init__(self, app: FastAPI, engine: AsyncLLM, *, host: str = "127.0.0.1", port: int = 8000,
                 shutdown_timeout: float = 0.0, log_level: str = "info", access_log: bool = True,
                 on_ready: Callable[[str], None] | None = None):
        self.engine, self.host, self.shutdown_timeout, self.on_ready = engine, host, shutdown_timeout, on_ready
        # uvicorn's grace outlasts the engine's drain, so the responses it ended with "abort" still go out.
        self.config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                                     timeout_graceful_shutdown=max(shutdown_timeout, 0.0) + _FLUSH_GRACE_S,
                                     log_config=None)
        self.server = _Server(self.config, engine, shutdown_timeout)
        self.port = port
        self.start_failed = False

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def serve(self, sock: socket.socket | None = None) -> int:
        """Serve until `request_exit()` or a signal; 0 on a clean stop, 1 if the engine failed to start."""
        if sock is not None:
            self.port = sock.getsockname()[1]
        self.engine.start()
        threading.Thread(target=self._watch_startup, name="vllm-jax-startup", daemon=True).start()
        try:
            await self.server.serve(sockets=[sock] if sock is not None else None)
        finally:
            try:
                await self.server.drain_engine()
            except Exception:
                logger.exception("engine shutdown failed")
        return 1 if self.start_failed else 0

    def request_exit(self) -> None:
        """Ask the server to stop (thread-safe): it drains as on SIGTERM."""
        self.server.should_exit = True

    def _watch_startup(self) -> None:
        try:
            self.engine.wait_until_ready()
        except Exception as exc:  # noqa: BLE001 - EngineDeadError or anything the start-up raised
            logger.error("%s; stopping the server", exc)
            self.start_failed = True
            self.request_exit()
            return
        if self.on_ready is not None:
            self.on_ready(self.base_url)


def serve_in_thread(server: HttpServer, sock: socket.socket) -> threading.Thread:
    """Run `server` on its own event loop in a daemon thread (tests, embedding); stop it with request_exit()."""
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sock)), name="vllm-jax-http", daemon=True)
    thread.start()
    return thread


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket (port 0: a free port chosen by the OS, read back from the socket)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def run_serve(args: Any, ns: Any, started: float | None = None) -> int:
    """`vllm-jax serve`: build the engine and the app from the parsed flags, serve until a signal.

    `started`: the perf_counter() reading when the command began, for the start-up time in the ready line."""
    started = time.perf_counter() if started is None else started
    config, problems = _checked_config(args, ns)
    if problems:
        for problem in problems:
            print(f"ERROR: {problem}", file=sys.stderr)
        return 2
    names = ns.served_model_name or [config.model_config.served_model_name]
    try:
        engine, app = _engine_and_app(config, ns, names)
    except (ValueError, OSError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(ns.host, ns.port)
    except OSError as exc:
        print(f"ERROR: cannot listen on {ns.host}:{ns.port}: {exc}", file=sys.stderr)
        return 1

    def announce(url: str) -> None:
        print(f"INFO: vllm-jax serving {names[0]} at {url}/v1 (started in {time.perf_counter() - started:.1f} s)",
              flush=True)

    server = HttpServer(app, engine, host=ns.host, port=ns.port, shutdown_timeout=ns.shutdown_timeout,
                        log_level=ns.uvicorn_log_level, on_ready=announce)
    logger.info("listening on %s (warming up the engine; /health answers 503 until it is ready)", server.base_url)
    return asyncio.run(server.serve(sock))


def _checked_config(args: Any, ns: Any) -> tuple[Any, list[str]]:
    """The engine config, or what is wrong: every problem with the server flags, else the config's own."""
    problems = [f"--{name} must be positive; got {value}" for name, value in (
        ("port", ns.port), ("max-request-bytes", ns.max_request_bytes),
        ("max-num-queued-requests", ns.max_num_queued_requests), ("responses-store-size", ns.responses_store_size))
        if value is not None and value <= 0]
    if ns.shutdown_timeout < 0:
        problems.append(f"--shutdown-timeout must be >= 0; got {ns.shutdown_timeout}")
    try:
        auto_tool_parser(ns.enable_auto_tool_choice, ns.tool_call_parser)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        return None, problems
    try:
        return args.create_config(), []
    except ValueError as exc:  # bad flag or model (ModelSourceError is a ValueError)
        return None, [str(exc)]


def _engine_and_app(config: Any, ns: Any, names: list[str]) -> tuple[Any, FastAPI]:
    """The engine (N replicas with --data-parallel-size N) and the app serving it. The server owns the stat
    loggers: the engine feeds the Prometheus one, which /metrics serves, and vLLM's periodic log line (both off,
    /metrics empty, with --disable-log-stats). The spec-decode series exist only with a speculative_config."""
    from vllm_jax.engine.async_llm import AsyncLLM
    from vllm_jax.metrics.logging_stats import LoggingStatLogger
    from vllm_jax.metrics.prometheus import PrometheusStatLogger
    from vllm_jax.server.api_server import build_app

    engine_cls: Any = AsyncLLM
    if config.parallel_config.data_parallel_size > 1:
        from vllm_jax.engine.data_parallel import DataParallelAsyncLLM

        engine_cls = DataParallelAsyncLLM  # N replicas behind the same interface
    metrics, stat_loggers = None, []
    if not ns.disable_log_stats:
        spec = config.speculative_config
        metrics = PrometheusStatLogger(config.model_config.served_model_name,
                                       num_speculative_tokens=None if spec is None else spec.num_speculative_tokens)
        stat_loggers = [metrics, LoggingStatLogger()]
    engine = engine_cls(config, max_num_queued_requests=ns.max_num_queued_requests, stat_loggers=stat_loggers)
    app = build_app(engine, served_model_names=names, api_key=ns.api_key, chat_template=ns.chat_template,
                    max_request_bytes=ns.max_request_bytes, log_requests=ns.enable_log_requests, metrics=metrics,
                    enable_tokenizer_info=ns.enable_tokenizer_info_endpoint,
                    enable_auto_tool_choice=ns.enable_auto_tool_choice, tool_call_parser=ns.tool_call_parser,
                    responses_store_size=0 if ns.disable_responses_store else ns.responses_store_size)
    return engine, app
