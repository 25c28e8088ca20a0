"""The engine flags of every command that builds an engine: one flag per `EngineArgs` field, spelled as vLLM
spells it (`--max-num-seqs`, `-tp`), and vLLM's human-readable sizes for the size flags (`--max-model-len 32k`,
`--kv-cache-memory-bytes 4G`: lower-case suffixes count in 1000s, upper-case in 1024s)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing

from vllm_jax.config.engine_args import EngineArgs

MODEL_HELP = "HF directory, cached hub id or .gguf file (default: the embedded SmolLM2-135M-Instruct)"

# The size flags that read `32k` / `4G` (vLLM's human_readable_int flags)
SIZE_FLAGS = frozenset({"max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes"})
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """`25.6k` -> 25600, `8K` -> 8192, `4G` -> 4 * 2**30, `512` -> 512: vLLM's rule (a fraction only with a
    decimal suffix, since 1.5K is no whole number of bytes in general)."""
    text = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text)
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer (or one like 32k, 8K, 4G)") from None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(f"{value!r}: a binary suffix ({suffix}) takes a whole number; did you "
                                         f"mean {number}{suffix.lower()}?")
    return int(number) * _BINARY[suffix]


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
    "max_model_len": "context length: prompt + output tokens, e.g. 32k (default: the model's max_position_embeddings)",
    "block_size": "tokens per KV-cache block (8, 16, 32, 64 or 128)",
    "enable_prefix_caching": "reuse the KV blocks of shared prompt prefixes",
    "gpu_memory_utilization": "fraction of accelerator memory for weights, activations and the KV cache",
    "kv_cache_memory_bytes": "KV-cache size in bytes, e.g. 4G (overrides --gpu-memory-utilization; CPU default 1 GiB)",
    "num_gpu_blocks_override": "number of KV-cache blocks, overriding every size computation",
    "max_num_seqs": "most requests in one batch (default: 32 on CPU, 256 on TPU/GPU)",
    "max_num_batched_tokens": "most tokens in one step, e.g. 8K (default: 512 on CPU, 8192 on TPU/GPU)",
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
        kind: typing.Any = int if "int" in hint else float if "float" in hint else str
        if f.name in SIZE_FLAGS:
            kind = human_readable_int
        # vLLM's `--lora-modules a=/x b=/y`, `--allowed-media-domains a.com b.org`
        nargs = "+" if f.name in ("lora_modules", "allowed_media_domains") else None
        group.add_argument(*flags, type=kind, default=f.default, metavar=f.name.upper(), help=help_text,
                           nargs=nargs)


def engine_args_from_namespace(ns: argparse.Namespace, model: str | None) -> EngineArgs:
    """The EngineArgs of a namespace parsed with add_engine_args' flags (`model` given apart: each command
    spells it its own way)."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs)
              if f.name != "model" and hasattr(ns, f.name)}
    return EngineArgs(model=model, **values)
