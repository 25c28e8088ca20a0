"""`vllm-jax serve`: vLLM's server flags, then the OpenAI-compatible server (server/launcher.py); a multi-host
worker (process id > 0) follows process 0 instead of serving HTTP."""

from __future__ import annotations

import argparse
import os
import time

from vllm_jax.config import MODEL_HELP, add_engine_args, engine_args_from_namespace, initialize_distributed


def run(ns: argparse.Namespace) -> int:
    started = time.perf_counter()
    from vllm_jax.server.launcher import run_serve

    names = ns.served_model_name
    if ns.api_key is None:
        ns.api_key = os.environ.get("VLLM_API_KEY") or None
    args = engine_args_from_namespace(ns, ns.model)
    args.served_model_name = names[0] if names else None
    if (getattr(ns, "process_id", None) or 0) > 0:  # a multi-host worker: it follows process 0, no HTTP server
        from vllm_jax.worker.follower import run_worker

        run_worker(args)
        return 0
    initialize_distributed(args)  # before the config: a multi-host leader joins the process group first
    return run_serve(args, ns, started=started)


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's `serve` flags (the engine flags come from add_engine_args)."""
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0 exposes the server to the network)")
    group.add_argument("--port", type=int, default=8000, help="port to listen on")
    group.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every route but /health, /metrics and /version "
                            "(default: $VLLM_API_KEY, else no key)")
    group.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="names the API answers to; the first is reported in responses (default: the model)")
    group.add_argument("--chat-template", default=None,
                       help="Jinja chat template, as a file path or inline (default: the tokenizer's)")
    group.add_argument("--max-num-queued-requests", type=int, default=None,
                       help="answer 503 at once when this many requests are already waiting (default: no limit)")
    group.add_argument("--max-request-bytes", type=int, default=None,
                       help="answer 413 to request bodies larger than this (default: 16 MiB)")
    group.add_argument("--shutdown-timeout", type=float, default=0.0,
                       help="on SIGTERM/SIGINT, seconds to let in-flight requests finish before aborting them")
    group.add_argument("--disable-log-stats", action="store_true",
                       help="do not collect or log engine statistics")
    group.add_argument("--enable-log-requests", action="store_true",
                       help="log each request's prompt and sampling parameters (off: prompts never reach the log)")
    group.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                       help="serve /tokenizer_info (the tokenizer's configuration and chat template), as vLLM does")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='let tool_choice "auto" (the default when a request has tools) parse the model\'s '
                            "tool calls, with --tool-call-parser")
    group.add_argument("--tool-call-parser", default=None, metavar="NAME",
                       help="the tool-call format the model writes: hermes (Qwen2.5, Qwen3, Hermes), llama3_json "
                            "(Llama 3.x), mistral or openai (gpt-oss's harmony)")
    group.add_argument("--responses-store-size", type=int, default=1024, metavar="N",
                       help="/v1/responses keeps the last N responses (least recently used evicted) for "
                            "previous_response_id and GET /v1/responses/{id}")
    group.add_argument("--disable-responses-store", action="store_true",
                       help="keep no responses (store is ignored; previous_response_id is refused)")
    group.add_argument("--uvicorn-log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="uvicorn's log level (access log lines are at info)")


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, metrics)",
                         description="Serve MODEL over an OpenAI-compatible HTTP API: /v1/completions, "
                         "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics, /version.",
                         formatter_class=formatter)
    srv.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    add_serve_args(srv)
    add_engine_args(srv, skip=frozenset({"served_model_name"}))
    srv.set_defaults(func=run)
