"""`vllm-jax compile-check`: the engine's own warm-up programs compiled ahead of time (vllm_jax.aot.engine_programs).

Always (CPU): the command's plumbing on this host's CPU target with a tiny Llama: the plan compiled is the
runner's own (labels, param shapes, block-table width), every forward aliases exactly the KV cache's bytes, the
JSON and exit codes, refusals that name the flag, the checks catching a copy, a fallback and a missing alias
(tensor parallelism over fake CPU devices: tests/multidevice/test_aot_engine_tp.py). With libtpu and the CUDA
plugin (else skipped): the full bucket set of a two-layer model with Llama-3-8B's heads and widths at
max_model_len 131072 and max_num_seqs 256, compiled for v5e, v6e and H100 (each target takes minutes) and v6e:2x2
with tensor parallelism 4, kernels present and the cache aliased.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest

from vllm_jax.aot import checks, targets
from vllm_jax.aot.compile import CompileReport
from vllm_jax.aot.engine_programs import check_target
from vllm_jax.aot.model_configs import write_config
from vllm_jax.aot.results import ProgramResult, TargetResult
from vllm_jax.cli import main
from vllm_jax.config import EngineArgs
from vllm_jax.worker.kv_budget import KVBudget, kv_budget

TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=320, hidden_size=64,
            intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
SMALL = ["--max-model-len", "256", "--max-num-seqs", "8", "--max-num-batched-tokens", "32"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tiny"), TINY)


@pytest.fixture(scope="module")
def cpu_run(tiny_dir, tmp_path_factory):
    """One compile-check of the tiny model on this host's CPU, through the CLI: (exit code, JSON)."""
    out = tmp_path_factory.mktemp("out") / "check.json"
    code = main(["compile-check", str(tiny_dir / "config.json"), "--target", "cpu", "--json", str(out), *SMALL])
    return code, json.loads(out.read_text())


def test_the_cpu_run_compiles_the_runners_own_plan(cpu_run, tiny_dir):
    from vllm_jax.worker.engine_builder import build_engine
    from vllm_jax.worker.model_runner import ModelRunner

    code, [result] = cpu_run
    assert code == 0 and result["ok"] and not result["failures"], result["failures"]
    args = EngineArgs(model=str(tiny_dir), max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32,
                      compilation_cache=False)
    config = args.create_config()
    runner = ModelRunner(config, random_weights=True)
    assert [p["label"] for p in result["programs"]] == [label for label, _ in runner.warmup_plan()]
    # every compile counted once, the KV probe's included (its samplers are the plan's, reused)
    assert result["compile_seconds"] >= sum(p["report"]["compile_seconds"] for p in result["programs"]
                                            if not p["reused"]) and result["compile_cpu_seconds"] > 0
    engine = build_engine(config, targets.get_target("cpu").devices, abstract=True)
    assert engine.max_blocks_per_seq == runner.max_blocks_per_seq
    import jax
    shapes = lambda tree: [(x.shape, str(x.dtype)) for x in jax.tree.leaves(tree)]  # noqa: E731
    assert shapes(engine.params) == shapes(runner.params)


def test_every_forward_aliases_exactly_the_kv_cache(cpu_run):
    _, [result] = cpu_run
    kv_bytes = result["budget"]["kv_bytes"]
    assert kv_bytes == result["budget"]["num_blocks"] * result["budget"]["bytes_per_block"] > 0
    forwards = [p for p in result["programs"] if p["kind"] == "forward"]
    assert forwards and all(p["report"]["memory"]["alias_size_in_bytes"] == kv_bytes for p in forwards)
    decode = [p for p in forwards if p["decode"]]
    assert decode and all(p["report"]["memory"]["temp_size_in_bytes"] < kv_bytes / 10 for p in decode)
    assert all(p["report"]["compile_seconds"] > 0 and p["report"]["bytes_accessed"] > 0
               for p in result["programs"])


def test_refusals_name_the_flag_and_fail_the_command(tiny_dir, capsys):
    code = main(["compile-check", str(tiny_dir), "--target", "cpu", "--kv-cache-memory-bytes", "65536", *SMALL])
    text = capsys.readouterr().out
    assert code == 1 and "REFUSED" in text and "--max-model-len" in text
    assert main(["compile-check", str(tiny_dir), "--target", "v9x"]) == 1
    assert "unknown target 'v9x'" in capsys.readouterr().out


def test_the_kv_budget_is_memory_minus_weights_minus_temporaries(tiny_dir):
    config = EngineArgs(model=str(tiny_dir), max_model_len=256, block_size=16).create_config()
    config = dataclasses.replace(config, cache_config=dataclasses.replace(config.cache_config,
                                                                          kv_cache_memory_bytes=None))
    budget = kv_budget(config, device_bytes=1 << 30, weight_bytes=200 << 20, temp_bytes=50 << 20,
                       bytes_per_block=4096)
    headroom = 64 << 20  # over an eighth of 50 MiB
    assert budget.num_blocks == (int(0.9 * (1 << 30)) - (200 << 20) - (50 << 20) - headroom) // 4096
    assert budget.fits
    big = kv_budget(config, device_bytes=1 << 34, weight_bytes=1 << 30, temp_bytes=1 << 30, bytes_per_block=4096)
    assert big.num_blocks == (int(0.9 * (1 << 34)) - (1 << 30) - (9 << 27)) // 4096  # temps plus an eighth
    with pytest.raises(ValueError, match="--tensor-parallel-size"):
        kv_budget(config, device_bytes=1 << 30, weight_bytes=900 << 20, temp_bytes=1, bytes_per_block=4096)
    with pytest.raises(ValueError, match="--max-model-len"):  # room for blocks, not for one 256-token request
        kv_budget(config, device_bytes=1 << 30, weight_bytes=int(0.9 * (1 << 30)) - (64 << 20) - 40_000,
                  temp_bytes=0, bytes_per_block=4096)


def _forward(label="forward T=8 S=8", alias=1 << 20, temp=1 << 10, kernels=("vllm_jax_ragged_paged_attention",)):
    report = CompileReport(target="x", ok=True, kernel_names=tuple(kernels), kernel_calls=len(kernels),
                           memory={"alias_size_in_bytes": alias, "temp_size_in_bytes": temp})
    return ProgramResult(label, "forward", 8, 8, report)


@pytest.mark.parametrize("program, complaint", [
    (_forward(), None),
    (_forward(alias=0), "not updated in place"),
    (_forward(temp=1 << 20), "a copy of the cache"),
    (_forward(kernels=()), "vllm_jax_ragged_paged_attention not in the compiled program"),
])
def test_the_checks_catch_a_copy_a_fallback_and_a_missing_alias(program, complaint):
    budget = KVBudget(device_bytes=1 << 30, usable_bytes=1 << 29, weight_bytes=1 << 20, temp_bytes=1 << 10,
                      bytes_per_block=1 << 10, num_blocks=1 << 10)
    result = checks.check(TargetResult("x", attention_backend="pallas_tpu", budget=budget, programs=[program]))
    assert result.ok == (complaint is None)
    assert complaint is None or complaint in result.failures[0]


# ---- real targets (libtpu / the CUDA plugin) ----

def _need(name: str) -> None:
    reason = targets.available(targets.CHIPS[name.split(":")[0]].platform)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def llama_2l(tmp_path_factory):
    """Llama-3-8B's heads and widths (32 q / 8 kv heads, head_dim 128, hidden 4096, intermediate 14336, vocab
    128256), two layers."""
    return write_config(tmp_path_factory.mktemp("llama3_2l"), num_hidden_layers=2)


@pytest.mark.slow
@pytest.mark.parametrize("target, tp", [("v5e:1x1", 1), ("h100", 1), ("v6e:1x1", 1), ("v6e:2x2", 4)])
def test_the_full_bucket_set_compiles_with_the_kernels_and_the_cache_in_place(llama_2l, target, tp):
    _need(target)
    args = EngineArgs(model=str(llama_2l), max_model_len=131072, max_num_seqs=256, tensor_parallel_size=tp)
    result = check_target(args, target)
    assert result.ok, result.refused or result.failures
    assert result.attention_backend == ("pallas_gpu" if target == "h100" else "pallas_tpu")
    assert (result.dtype, result.max_num_batched_tokens, result.tensor_parallel_size) == ("bfloat16", 8192, tp)
    forwards = [p for p in result.programs if p.kind == "forward"]
    assert [p.num_tokens for p in forwards] == [16 << i for i in range(10)]  # 16 ... 8192
    kinds = collections.Counter(p.kind for p in result.programs)
    # per sequence bucket (16 ... 256) the sampler and its processors, and async scheduling's token record; per
    # token bucket its token feed
    assert kinds == {"forward": 10, "sampler": 2 * 5, "token": 5 + 10}, kinds
    for p in forwards:
        assert set(checks.expected_kernels(result)) <= set(p.report.kernel_names), p.label
        assert p.report.memory["alias_size_in_bytes"] == result.budget.kv_bytes, p.label
    assert result.budget.fits and result.budget.kv_bytes > result.budget.weight_bytes


def test_a_model_too_big_for_the_chip_is_refused_before_compiling(tmp_path):
    _need("v5e:1x1")
    result = check_target(EngineArgs(model=str(write_config(tmp_path)), max_model_len=8192), "v5e:1x1")
    assert result.refused and "--tensor-parallel-size" in result.refused and not result.programs


def test_lora_programs_compile_ahead_of_time(tiny_dir, tmp_path):
    """--enable-lora: the plan (forwards over abstract adapter slots, the slot-write program) compiles for the
    target, and the KV cache still aliases in place."""
    out = tmp_path / "lora.json"
    code = main(["compile-check", str(tiny_dir / "config.json"), "--target", "cpu", "--json", str(out), *SMALL,
                 "--enable-lora", "--max-loras", "2"])
    [result] = json.loads(out.read_text())
    assert code == 0 and result["ok"] and not result["failures"], result["failures"]
    assert result["programs"][-1]["label"] == "lora slot write"


def test_compile_check_takes_a_config_json_its_folder_or_a_gguf_file(tmp_path):
    """A GGUF file is passed on as the model (its metadata is the config, and `--quantization gguf` needs its
    tensor types); any other file is copied in as config.json; a missing path says what to give."""
    from vllm_jax.aot.report import model_directory

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert model_directory(str(gguf), str(tmp_path / "scratch")) == str(gguf)
    config = write_config(tmp_path / "llama")
    assert model_directory(str(config / "config.json"), "unused") == str(config)
    (tmp_path / "scratch").mkdir()
    other = tmp_path / "llama.json"
    other.write_text((config / "config.json").read_text())
    assert model_directory(str(other), str(tmp_path / "scratch")) == str(tmp_path / "scratch")
    with pytest.raises(ValueError, match="GGUF"):
        model_directory(str(tmp_path / "missing"), "unused")


def test_a_failed_forward_leaves_its_samplers_a_message_not_a_key_error():
    """The check goes on past a forward that does not compile; the samplers of its sequence bucket then have no
    logits to compile for, and their reports must say so (they once read `KeyError: 8`)."""
    from vllm_jax.aot.engine_programs import _Recorder
    from vllm_jax.worker.compilation import CompilationManager, StepShapes, TraceCounter

    class FailingForward:
        lora = None

        def precompile_forward(self, inputs):
            raise ValueError("the kernel plan needs more VMEM than the chip has")

    shapes = StepShapes(buckets=[(16, 8)], block_size=16, max_blocks_per_seq=4, vocab_size=320)
    plan = CompilationManager(FailingForward(), TraceCounter(), shapes, None).plan()
    results = _Recorder(targets.get_target("cpu"), None).run(plan)
    assert [r.label.split()[0] for r in results] == ["forward"] + ["sampler"] * 2
    assert "VMEM" in results[0].report.error
    for sampler in results[1:]:
        assert not sampler.report.ok and "forward of sequence bucket S=8 failed" in sampler.report.error
