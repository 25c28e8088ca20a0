"""benchmarks/vs_llamacpp.py's readers of llama-bench and llama-batched-bench output (the benchmark itself builds
llama.cpp and is not run here), on output in the tools' formats (their printers in the 0.3.36 sdist's llama.cpp)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llamacpp.py"
_spec = importlib.util.spec_from_file_location("vs_llamacpp", SCRIPT)
vs_llamacpp = importlib.util.module_from_spec(_spec)
sys.modules["vs_llamacpp"] = vs_llamacpp  # dataclasses look their module up there
_spec.loader.exec_module(vs_llamacpp)

LLAMA_BENCH = (
    'load_backend: loaded CPU backend\n'
    '{"build_commit": "unknown", "build_number": 0, "cpu_info": "AMD EPYC", "model_type": "llama ?B F32", '
    '"n_threads": 2, "n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ns": 2126000000, "stddev_ns": 9000000, '
    '"avg_ts": 60.207, "stddev_ts": 0.25, "samples_ns": [ 2120000000, 2132000000 ],'
    '"samples_ts": [ 60.37, 60.04 ]}\n')

BATCHED_BENCH = (
    'main: n_kv_max = 6144, ...\n'
    '{"n_kv_max": 6144, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, "n_gpu_layers": -1, '
    '"n_threads": 2, "n_threads_batch": 2, "pp": 128, "tg": 64, "pl": 32, "n_kv": 6144, "t_pp": 3.1, '
    '"speed_pp": 1321.29, "t_tg": 6.2, "speed_tg": 330.32, "t": 9.3, "speed": 660.65}\n')


def test_llama_bench_reads_the_text_generation_rate():
    assert vs_llamacpp.parse_llama_bench(LLAMA_BENCH) == pytest.approx(60.207)
    prompt_only = LLAMA_BENCH.replace('"n_prompt": 0, "n_gen": 128', '"n_prompt": 512, "n_gen": 0')
    with pytest.raises(ValueError, match="no text-generation record"):
        vs_llamacpp.parse_llama_bench(prompt_only)


def test_batched_bench_reads_its_row_and_a_skipped_row_is_an_error():
    assert vs_llamacpp.parse_batched_bench(BATCHED_BENCH, 32)["speed_tg"] == pytest.approx(330.32)
    with pytest.raises(ValueError, match="no row for 16 sequences"):
        vs_llamacpp.parse_batched_bench(BATCHED_BENCH, 16)


def test_the_table_has_the_issue_rows_with_ratios():
    def rates(decode: float) -> dict:
        return {"decode_tok_s": decode, "end_to_end_tok_s": decode * 0.9}

    results = {"llamacpp": {"f32_batch1": 60.0, "q4_1_batch1": 120.0, "f32_batched": {"speed_tg": 330.0}},
               "vllm_jax": {"f32": {"batch1": rates(30.0), "batched": rates(330.0)}, "q4_1": {"batch1": rates(96.0)}}}
    lines = vs_llamacpp.table(results).splitlines()
    assert len(lines) == 5
    assert "| 60.0 | 30.0 | 0.50x | >= 1.0x | 27.0 |" in lines[2]
    assert "| 120.0 | 96.0 | 0.80x | >= 0.8x |" in lines[3]
    assert "| 330.0 | 330.0 | 1.00x | >= 1.0x |" in lines[4]
