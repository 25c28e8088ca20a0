"""The KV cache sized from the compiled programs' temporaries on an accelerator (worker/kv_budget.py).

This host's CPU has no memory statistics, so the runner's accelerator path is driven with a device memory
figure patched in (kv_cache.device_memory): the probe really compiles the largest bucket's programs and the
block count must follow memory x utilization - weights - temporaries (with the headroom) exactly.
"""

from __future__ import annotations

import dataclasses

import pytest

from vllm_jax.aot.model_configs import write_config
from vllm_jax.config import EngineArgs
from vllm_jax.worker import kv_budget as kv_budget_module
from vllm_jax.worker import kv_cache
from vllm_jax.worker.kv_budget import temp_headroom
from vllm_jax.worker.model_runner import ModelRunner

TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=320, hidden_size=64,
            intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
MiB = 1 << 20


def _accelerator_config(model_dir, **overrides):
    """A CPU config whose cache is sized as on a TPU / GPU: no explicit budget, no override."""
    config = EngineArgs(model=str(model_dir), max_model_len=256, block_size=16, max_num_seqs=8, dtype="float32",
                        **overrides).create_config()
    return dataclasses.replace(config, cache_config=dataclasses.replace(config.cache_config,
                                                                        kv_cache_memory_bytes=None))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tiny"), TINY)


def test_the_runner_sizes_the_cache_from_the_probes_temporaries(tiny_dir, monkeypatch):
    device_bytes, weights = 512 * MiB, 3 * MiB
    monkeypatch.setattr(kv_cache, "device_memory", lambda device: (device_bytes, weights))
    probed = []
    real_probe = kv_budget_module.probe_temp_bytes

    def probe(*args, **kwargs):
        probed.append(real_probe(*args, **kwargs))
        return probed[-1]

    import vllm_jax.worker.model_runner as runner_module
    monkeypatch.setattr(runner_module, "probe_temp_bytes", probe)
    for tokens in (32, 256):  # a bigger largest bucket has bigger temporaries
        runner = ModelRunner(_accelerator_config(tiny_dir, max_num_batched_tokens=tokens), random_weights=True)
        per_block = 2 * 16 * 2 * 2 * 16 * 4  # layers x block x K/V x kv heads x head_dim x float32
        usable = int(0.9 * device_bytes)
        assert runner.num_blocks == (usable - weights - temp_headroom(probed[-1])) // per_block
        assert runner.num_compilations == 0  # the probe's programs are not counted as the runner's traces
    small, large = probed
    assert 0 < small < large  # measured, not a constant


@pytest.fixture
def fixed_probe(monkeypatch):
    """The probe's answer fixed at 1 MiB (its measurement is tested above), for the refusals' arithmetic."""
    import vllm_jax.worker.model_runner as runner_module
    monkeypatch.setattr(runner_module, "probe_temp_bytes", lambda *a, **k: MiB)
    return MiB + 64 * MiB  # what the budget keeps free for it (temp_headroom)


def test_weights_that_leave_no_room_are_refused_naming_the_flags(tiny_dir, monkeypatch, fixed_probe):
    monkeypatch.setattr(kv_cache, "device_memory", lambda device: (100 * MiB, 90 * MiB - fixed_probe))
    with pytest.raises(ValueError, match="--tensor-parallel-size or --gpu-memory-utilization"):
        ModelRunner(_accelerator_config(tiny_dir), random_weights=True)


def test_a_cache_too_small_for_one_request_names_max_model_len(tiny_dir, monkeypatch, fixed_probe):
    per_block = 2 * 16 * 2 * 2 * 16 * 4
    # room for 10 blocks; max_model_len 256 needs 16 and the null block
    monkeypatch.setattr(kv_cache, "device_memory",
                        lambda device: (100 * MiB, 90 * MiB - fixed_probe - 10 * per_block))
    with pytest.raises(ValueError, match=r"needs 16 KV blocks .* only 9 usable blocks; lower --max-model-len or "
                                         r"raise --gpu-memory-utilization or --tensor-parallel-size"):
        ModelRunner(_accelerator_config(tiny_dir), random_weights=True)
