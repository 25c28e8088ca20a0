"""EngineArgs -> EngineConfig: no side effects; joining a multi-host run is the entry points' explicit step."""

from __future__ import annotations

import jax
import pytest

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.attention import selector
from vllm_jax.config import EngineArgs, initialize_distributed
from vllm_jax.sharding import multihost

MULTI_HOST = dict(distributed_coordinator="127.0.0.1:1234", num_processes=2, process_id=1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("config") / "llama"
    make_tiny_checkpoint("llama", path)
    return str(path)


@pytest.fixture
def joins(monkeypatch) -> list[tuple]:
    """Every call that would join a process group, recorded instead of made."""
    calls: list[tuple] = []
    monkeypatch.setattr(multihost, "initialize_distributed", lambda *args: calls.append(args))
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: calls.append(("jax", a, kw)))
    return calls


def test_create_config_joins_no_process_group_even_for_a_multi_host_run(checkpoint, joins):
    config = EngineArgs(model=checkpoint, max_model_len=64, **MULTI_HOST).create_config()
    assert config.model_config.max_model_len == 64 and joins == []


def test_initialize_distributed_joins_with_the_flags_only_when_asked(joins):
    initialize_distributed(EngineArgs())
    assert joins == []
    initialize_distributed(EngineArgs(**MULTI_HOST))
    assert joins == [("127.0.0.1:1234", 2, 1)]


@pytest.mark.parametrize("name", ["auto", *selector.BACKENDS])
def test_every_dispatch_backend_is_a_valid_flag(checkpoint, name):
    assert EngineArgs(model=checkpoint, max_model_len=64, attention_backend=name).create_config().attention_backend \
        == name


def test_an_unknown_backend_is_refused_naming_the_dispatch_list(checkpoint, monkeypatch):
    monkeypatch.setattr(selector, "BACKENDS", ("xla",))
    with pytest.raises(ValueError, match=r"attention_backend must be one of auto, xla; got 'pallas_tpu'"):
        EngineArgs(model=checkpoint, attention_backend="pallas_tpu").create_config()


def test_a_tpu_platform_on_this_cpu_host_gets_the_accelerator_defaults_and_the_mosaic_kernel(checkpoint):
    config = EngineArgs(model=checkpoint, tensor_parallel_size=4).create_config(platform="tpu")
    assert config.platform == "tpu" and jax.default_backend() == "cpu"
    assert config.model_config.dtype == "bfloat16" and config.model_config.kv_cache_dtype == "bfloat16"
    sc = config.scheduler_config
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (256, 8192)
    assert (sc.min_token_bucket, sc.min_seq_bucket, sc.bucket_growth) == (16, 8, 2)
    assert config.cache_config.kv_cache_memory_bytes is None  # sized from the device, not the CPU's 1 GiB
    assert config.resolved_attention_backend.name == "pallas_tpu"  # `auto` keeps the kernel under tp 4


def test_the_platform_picks_the_kernel_and_cpu_stays_as_it_was(checkpoint):
    cpu = EngineArgs(model=checkpoint, max_model_len=64).create_config()
    assert cpu.platform == "cpu" and cpu.resolved_attention_backend.name == "xla"
    assert cpu.model_config.dtype == "float32" and cpu.scheduler_config.max_num_seqs == 32
    interpret = EngineArgs(model=checkpoint, max_model_len=64, attention_backend="pallas_gpu").create_config()
    assert interpret.resolved_attention_backend.name == "pallas_gpu"  # interpret mode on this host
    gpu = EngineArgs(model=checkpoint, max_model_len=64).create_config(platform="cuda")
    assert gpu.platform == "gpu" and gpu.resolved_attention_backend.name == "pallas_gpu"


def test_the_layer_loop_defaults_to_unrolled_on_gpu_only_and_the_flag_wins(checkpoint):
    """XLA:GPU copies a scanned layer's weights out of the stack before each dot
    (config/platform_defaults.py: SCAN_LAYERS_DEFAULT)."""
    loops = {platform: EngineArgs(model=checkpoint, max_model_len=64).create_config(platform=platform).scan_layers
             for platform in ("cpu", "tpu", "gpu")}
    assert loops == {"cpu": True, "tpu": True, "gpu": False}
    for platform in ("cpu", "gpu"):
        for scan in (True, False):
            args = EngineArgs(model=checkpoint, max_model_len=64, scan_layers=scan)
            assert args.create_config(platform=platform).scan_layers is scan


def test_the_other_chips_kernel_and_an_unknown_platform_are_refused_at_config_time(checkpoint):
    with pytest.raises(ValueError, match=r"attention_backend 'pallas_gpu' does not run on tpu"):
        EngineArgs(model=checkpoint, attention_backend="pallas_gpu").create_config(platform="tpu")
    with pytest.raises(ValueError, match=r"platform must be one of cpu, tpu, gpu; got 'npu'"):
        EngineArgs(model=checkpoint).create_config(platform="npu")


@pytest.mark.parametrize("kv_cache_dtype, platform, warned", [
    ("bfloat16", "cpu", True), ("fp8", "cpu", True), ("float16", "cpu", False), ("auto", "cpu", False),
    ("bfloat16", "tpu", False)])
def test_a_kv_cache_dtype_that_xla_cpu_writes_slowly_is_warned_about_on_cpu_only(checkpoint, caplog, kv_cache_dtype,
                                                                                  platform, warned):
    """XLA:CPU widens a bfloat16 or fp8 cache's every-step write to float32 over the whole cache (~11x slower
    decode, docs/quantization.md): the engine still runs it, as vLLM would, and says why it is slow."""
    with caplog.at_level("WARNING", logger="vllm_jax.config"):
        config = EngineArgs(model=str(checkpoint), kv_cache_dtype=kv_cache_dtype).create_config(platform=platform)
    assert config.model_config.kv_cache_dtype in ("float32", "bfloat16", "float16", "float8_e4m3fn")
    assert ("KV cache on CPU" in caplog.text) == warned
