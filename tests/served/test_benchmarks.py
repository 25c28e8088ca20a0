"""The benchmark harness's device mode end to end, as a user runs it (`python benchmarks/compare.py --device-mode`,
here on CPU at the tiny shape), read back from its JSON: it must report the workload it was asked for, the model
it built, and steady-state steps that compile nothing."""

from __future__ import annotations

import json
import re

from tests.helpers.processes import run_python

# benchmarks/device_decode.py's "tiny" shape, in float32 on CPU
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 128, 2, 4, 2, 512
HEAD_DIM = HIDDEN // HEADS


def _tiny_llama_bytes() -> int:
    """Embedding, untied LM head, final norm, and per layer q/k/v/o, gate/up/down and two norms; 4 bytes each."""
    per_layer = (HIDDEN * HEADS * HEAD_DIM * 2 + HIDDEN * KV_HEADS * HEAD_DIM * 2 + 3 * HIDDEN * INTERMEDIATE
                 + 2 * HIDDEN)
    return 4 * (2 * VOCAB * HIDDEN + HIDDEN + LAYERS * per_layer)


def test_device_mode_reports_the_batches_context_and_model_it_ran_and_compiles_nothing_while_timed(tmp_path):
    out = tmp_path / "device.json"
    proc = run_python("benchmarks/compare.py", "--device-mode", "--device-shape", "tiny", "--batches", "1", "3",
                      "--context", "40", "--repeats", "2", "--output-json", str(out))
    rows = json.loads(out.read_text())
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 40), (3, 40)]
    for r in rows:
        assert r["num_tokens"] >= r["batch"]  # the token bucket the decode rows were packed into
        assert r["num_layers"] == LAYERS
        assert r["weight_bytes"] == _tiny_llama_bytes()
        assert r["kv_bytes_per_token"] == LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
        assert r["compilations_while_timed"] == 0  # the timed steps reuse the warm program
        assert r["step_ms"] > 0 and r["share_of_bandwidth"] > 0
    assert [f"batch {r['batch']:4d} x 40 context" in proc.stdout for r in rows] == [True, True]


def test_the_aot_roofline_counts_what_a_decode_step_must_read(tmp_path):
    """benchmarks/aot_roofline.py on this host's CPU target (float32, the CPU default), one Llama-3-8B-shaped
    layer: the bytes a step must read are the weights less the embedding table, plus the gathered rows and the KV
    the batch touches; the compiled program's count is at least that (XLA:CPU's cost analysis charges the
    embedding gather its whole table, so on CPU the ratio says nothing), and the roofline follows from it."""
    out = tmp_path / "roofline.json"
    proc = run_python("benchmarks/aot_roofline.py", "--targets", "cpu", "--batches", "2", "--contexts", "256",
                      "--layers", "1", "--json", str(out))
    [row] = json.loads(out.read_text())
    hidden, inter, kv, vocab, f32 = 4096, 14336, 8 * 128, 128256, 4
    layer = hidden * hidden * 2 + hidden * kv * 2 + 3 * hidden * inter + 2 * hidden
    must = f32 * (layer + hidden + vocab * hidden + 2 * hidden) + 2 * 256 * 2 * kv * f32
    assert (row["batch"], row["context"], row["fits"]) == (2, 256, True)
    assert row["must_read_bytes"] == must
    assert row["program_bytes"] > 0.95 * must and row["ratio"] == row["program_bytes"] / must
    assert row["roofline_s"] == max(row["hbm_bytes"] / 50e9, row["flops"] / 1e12)  # the host's nominal figures
    assert row["tok_s"] == 2 / row["roofline_s"]
    assert "| cpu | float32 | 2 | 0k |" in proc.stdout


def test_host_overhead_reports_each_stage_of_a_decode_step_and_profiles_one_size():
    """benchmarks/host_overhead.py at a tiny size: one table row per request count and mode, the stages add up
    to the step (medians, so within rounding of the other column), a tok/s table, and the cProfile run prints
    the engine's step."""
    proc = run_python("benchmarks/host_overhead.py", "--num-requests", "2", "3", "--input-len", "2",
                      "--output-len", "4", "--profile", "2")
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()
            if line.startswith("| ") and "ms" not in line and "tok/s" not in line]
    stage_rows = [r for r in rows if len(r) == 12]
    assert [(int(r[0]), r[1].strip()) for r in stage_rows] == [(2, "sync"), (2, "async"), (3, "sync"), (3, "async")]
    for r in stage_rows:
        step, *stages = (float(x) for x in r[2:9])
        assert min(stages) >= 0 and step > 0 and r[10].strip().endswith("%") and float(r[11]) > 0
    assert [int(r[0]) for r in rows if len(r) == 3] == [2, 3]  # end-to-end tok/s, sync and async
    assert re.search(r"cProfile over [1-9]\d* decode steps", proc.stdout) and "llm_engine.py" in proc.stdout


def test_the_attention_timings_run_every_backend_in_its_own_cache_layout(tmp_path):
    """benchmarks/attention_kernels.py --smoke (device_check's last stage): every backend times every row; the
    pallas_tpu column once failed on the interleaved cache it was handed instead of its lane-dense one."""
    out = tmp_path / "attention.json"
    run_python("benchmarks/attention_kernels.py", "--smoke", "--iters", "2", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert {r["column"] for r in rows} == {"xla", "pallas_tpu", "pallas_gpu"}
    assert len({r["shape"] for r in rows}) == 3  # a decode batch, a mixed batch, a KV write
    assert [r for r in rows if "error" in r or not r["us"] > 0] == []


def _xspace(plane: str, lines: dict[str, list[tuple[str, int]]]):
    """A profiler trace of one plane: line name -> [(event name, duration in ns)]."""
    import jax

    names = sorted({name for events in lines.values() for name, _ in events})
    ids = {name: i + 1 for i, name in enumerate(names)}
    text = f'planes {{ id: 1 name: "{plane}" '
    for n, (line, events) in enumerate(lines.items()):
        text += f'lines {{ id: {n + 1} name: "{line}" timestamp_ns: 0 '
        offset = 0
        for name, ns in events:
            text += f"events {{ metadata_id: {ids[name]} offset_ps: {offset} duration_ps: {ns * 1000} }} "
            offset += (ns + 1) * 1000
        text += "} "
    text += " ".join(f'event_metadata {{ key: {i} value {{ id: {i} name: "{name}" }} }}' for name, i in ids.items())
    data = jax.profiler.ProfileData
    return data.from_serialized_xspace(data.text_proto_to_serialized_xspace(text + " }"))


def test_the_attention_timings_read_kernel_time_from_the_device_plane():
    """attention_kernels.kernel_time: a GPU's compute streams (copies left out) or a TPU's "XLA Ops" line, per
    call, the largest kernels first; nothing without a device plane (the CPU smoke run)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_kernels.py"
    module_spec = importlib.util.spec_from_file_location("attention_kernels", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    gpu = _xspace("/device:GPU:0", {"Stream #13(Compute)": [("pad", 4000), ("ragged_attention", 30000)] * 2,
                                    "Stream #20(MemcpyH2D)": [("copy", 90000)]})
    us, kernels = module.kernel_time(gpu, calls=2)
    assert us == 34.0 and kernels == [("ragged_attention", 30.0), ("pad", 4.0)]
    tpu = _xspace("/device:TPU:0", {"XLA Modules": [("jit_fn", 50000)], "XLA Ops": [("fusion", 20000)]})
    assert module.kernel_time(tpu, calls=1) == (20.0, [("fusion", 20.0)])
    assert module.kernel_time(_xspace("/host:CPU", {"tf_XLA": [("fusion", 5)]}), calls=1) is None


def test_the_serving_checkpoint_has_the_default_models_shapes_and_tokenizer(tmp_path):
    """benchmarks/serving_checkpoint.py (for a machine the default model's GGUF cannot travel to): its config gives
    the default model's decoder spec, and its tokenizer the default model's token ids."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoConfig, AutoTokenizer

    from vllm_jax import EngineArgs
    from vllm_jax.model.spec import spec_from_hf_config
    from vllm_jax.model_loader.tokenizer import load_tokenizer

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "serving_checkpoint.py"
    module_spec = importlib.util.spec_from_file_location("serving_checkpoint", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    module.write_config_and_tokenizer(tmp_path)

    default = EngineArgs().create_config().model_config
    written = AutoConfig.from_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert spec_from_hf_config(written) == spec_from_hf_config(default.hf_config)
    text = "Weather in Paris? <|im_start|>user\nÇa va, 東京?"
    assert AutoTokenizer.from_pretrained(tmp_path).encode(text) == load_tokenizer(default).encode(text)


def test_no_benchmark_script_hides_an_installed_package():
    """`python benchmarks/X.py` puts benchmarks/ first on sys.path, so a script named like an installed package
    replaces it for every import: a benchmarks/kernels.py once broke transformers (it imports HF's `kernels`)."""
    import importlib.util
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[2] / "benchmarks"
    hidden = [p.name for p in sorted(scripts.glob("*.py"))
              if (found := importlib.util.find_spec(p.stem)) is not None
              and Path(found.origin or "").resolve().parent != scripts]
    assert not hidden, f"these benchmark scripts share a name with an installed module: {hidden}"
