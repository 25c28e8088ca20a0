"""The KV cache sized from the compiled programs' temporaries on an accelerator (worker/kv_budget.py).

This host's CPU has no memory statistics, so the runner's accelerator path is driven with a device memory
figure passed in (engine_builder.MemoryProbe): the probe really compiles the largest bucket's programs and the
block count must follow memory x utilization - weights - temporaries (with the headroom) exactly.
"""

from __future__ import annotations

import dataclasses

import pytest

from vllm_jax.aot.model_configs import write_config
from vllm_jax.config import EngineArgs
from vllm_jax.worker.engine_builder import MemoryProbe
from vllm_jax.worker.kv_budget import probe_temp_bytes, temp_headroom
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


def test_the_runner_sizes_the_cache_from_the_probes_temporaries(tiny_dir):
    device_bytes, weights = 512 * MiB, 3 * MiB
    probed = []

    def probe(*args, **kwargs):
        probed.append(probe_temp_bytes(*args, **kwargs))
        return probed[-1]

    memory = MemoryProbe(device_memory=lambda device: (device_bytes, weights), temp_bytes=probe)
    for tokens in (32, 256):  # a bigger largest bucket has bigger temporaries
        runner = ModelRunner(_accelerator_config(tiny_dir, max_num_batched_tokens=tokens), random_weights=True,
                             memory=memory)
        per_block = 2 * 16 * 2 * 2 * 16 * 4  # layers x block x K/V x kv heads x head_dim x float32
        usable = int(0.9 * device_bytes)
        assert runner.num_blocks == (usable - weights - temp_headroom(probed[-1])) // per_block
        assert runner.num_compilations == 0  # the probe's programs are not counted as the runner's traces
    small, large = probed
    assert 0 < small < large  # measured, not a constant


FIXED_PROBE = MiB  # the probe's answer for the refusals' arithmetic (its measurement is tested above)
KEPT_FOR_PROBE = FIXED_PROBE + 64 * MiB  # what the budget keeps free for it (temp_headroom)


def _memory(device_bytes: int, in_use: int) -> MemoryProbe:
    return MemoryProbe(device_memory=lambda device: (device_bytes, in_use), temp_bytes=lambda *a: FIXED_PROBE)


def test_weights_that_leave_no_room_are_refused_naming_the_flags(tiny_dir):
    with pytest.raises(ValueError, match="--tensor-parallel-size or --gpu-memory-utilization") as refused:
        ModelRunner(_accelerator_config(tiny_dir), random_weights=True,
                    memory=_memory(100 * MiB, 90 * MiB - KEPT_FOR_PROBE))
    # what the device has in use is read as the weights: the message says so (on an H200 a test's second engine
    # was refused while the first one's cache was still alive, and "the weights (94.30 GiB)" misled)
    assert "every array alive on it" in str(refused.value)


def test_a_cache_too_small_for_one_request_names_max_model_len(tiny_dir):
    per_block = 2 * 16 * 2 * 2 * 16 * 4
    # room for 10 blocks; max_model_len 256 needs 16 and the null block
    memory = _memory(100 * MiB, 90 * MiB - KEPT_FOR_PROBE - 10 * per_block)
    with pytest.raises(ValueError, match=r"needs 16 KV blocks .* only 9 usable blocks; lower --max-model-len or "
                                         r"raise --gpu-memory-utilization or --tensor-parallel-size"):
        ModelRunner(_accelerator_config(tiny_dir), random_weights=True, memory=memory)
