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


# the tiny model's float32 params: embedding and LM head, 2 layers of q/k/v/o and gate/up/down, and the norms
TINY_WEIGHTS = 4 * (2 * 320 * 64 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 64)


def _recording_probe(calls: list, forward_extra: int = 0):
    """probe_temp_bytes, recording each call (stage, the step it compiled on, its answer); `forward_extra`: bytes
    added to the forward stage's answer (a forward that needs more than the samplers)."""
    def probe(step, shapes, **kwargs):
        stage = "samplers" if kwargs.get("forwards") is False else "forward"
        temps = probe_temp_bytes(step, shapes, **kwargs) + (forward_extra if stage == "forward" else 0)
        calls.append((stage, step, temps))
        return temps
    return probe


PER_BLOCK = 2 * 16 * 2 * 2 * 16 * 4  # layers x block x K/V x kv heads x head_dim x float32


def _blocks(device_bytes: int, temps: int) -> int:
    return (int(0.9 * device_bytes) - TINY_WEIGHTS - temp_headroom(temps)) // PER_BLOCK


def test_the_runner_sizes_the_cache_from_the_probes_temporaries(tiny_dir):
    device_bytes, largest = 512 * MiB, []
    for tokens in (32, 256):  # a bigger largest bucket has bigger temporaries
        calls = []
        memory = MemoryProbe(device_memory=lambda device: (device_bytes, TINY_WEIGHTS),
                             temp_bytes=_recording_probe(calls))
        runner = ModelRunner(_accelerator_config(tiny_dir, max_num_batched_tokens=tokens), random_weights=True,
                             memory=memory)
        # the samplers first (they read no cache), then the forward over a cache of the size they leave
        (stage0, samplers, sampler_temps), (stage1, forward, forward_temps) = calls[:2]
        assert (stage0, stage1) == ("samplers", "forward")
        assert forward.kv_cache.shape[1] == _blocks(device_bytes, sampler_temps)
        assert runner.num_blocks == _blocks(device_bytes, max(sampler_temps, forward_temps))
        assert len(calls) == (3 if forward_temps > sampler_temps else 2)
        assert calls[-1][1].kv_cache.shape == runner.device.kv_cache.shape  # compiled for the engine's own cache
        assert runner.num_compilations == 0  # the probe's programs are not counted as the runner's traces
        largest.append(max(sampler_temps, forward_temps))
    assert 0 < largest[0] < largest[1]  # measured, not a constant


@pytest.mark.parametrize("tp", [1, 2])
def test_warm_up_takes_the_probes_forward_and_samplers_over(tiny_dir, tp):
    """The largest bucket's forward is compiled once, by the probe, at the engine's cache size: warm-up adopts it
    (and the samplers, compiled first for the logits layout the forward then has: vocab-sharded under tensor
    parallelism), and it runs on the engine's allocated cache."""
    calls = []
    memory = MemoryProbe(device_memory=lambda device: (256 * MiB, TINY_WEIGHTS), temp_bytes=_recording_probe(calls))
    runner = ModelRunner(_accelerator_config(tiny_dir, tensor_parallel_size=tp), random_weights=True, memory=memory)
    probed = calls[-1][1]
    forward_keys = [key for key in probed._executables if key[0] == "forward"]
    sampler_keys = [key for key in calls[0][1]._executables]
    assert len(forward_keys) == 1 and sampler_keys
    # the prediction held: the forward's step compiled no samplers of its own, it holds the first stage's
    assert all(probed._executables[key] is calls[0][1]._executables[key] for key in sampler_keys)
    compilation = runner.compilation
    traces_before = runner.num_compilations
    compilation.warmup(show_progress=False)
    for key in forward_keys + sampler_keys:
        assert runner.device._executables[key] is probed._executables[key]
    # every other forward and sampler was traced by warm-up; the adopted ones were not
    plan_forwards = sum(label.startswith("forward") for label, _ in compilation.plan())
    traced = runner.num_compilations - traces_before
    assert plan_forwards > 1 and traced >= plan_forwards - 1
    num_tokens, num_seqs = compilation.shapes.buckets[-1]
    logits = runner.device.forward(compilation.empty_inputs(num_tokens, num_seqs))
    assert logits.shape == (num_seqs, TINY["vocab_size"])
    assert runner.num_compilations == traced + traces_before  # running the adopted forward traced nothing


@pytest.mark.parametrize("kind", ["pooling", "lora"])
def test_a_step_whose_forward_differs_does_not_adopt_the_probes(tiny_dir, kind):
    """A pooling engine's forward ends at the final norm, a LoRA engine's reads the adapter slots: the probe's
    generation forward is not theirs, so warm-up compiles their own (the samplers are adopted all the same)."""
    calls = []
    memory = MemoryProbe(device_memory=lambda device: (256 * MiB, TINY_WEIGHTS), temp_bytes=_recording_probe(calls))
    extra = (dict(runner="pooling", convert="embed", pooler_config={"pooling_type": "MEAN"}) if kind == "pooling"
             else dict(enable_lora=True, max_loras=1, max_lora_rank=8))
    runner = ModelRunner(_accelerator_config(tiny_dir, **extra), random_weights=True, memory=memory)
    probed = calls[-1][1]
    forward_keys = [key for key in probed._executables if key[0] == "forward"]
    assert forward_keys
    assert all(runner.device._executables.get(key) is not probed._executables[key] for key in forward_keys)


def test_a_forward_needing_more_than_the_samplers_sizes_the_cache_again(tiny_dir):
    calls = []
    device_bytes, extra = 512 * MiB, 100 * MiB
    memory = MemoryProbe(device_memory=lambda device: (device_bytes, TINY_WEIGHTS),
                         temp_bytes=_recording_probe(calls, forward_extra=extra))
    runner = ModelRunner(_accelerator_config(tiny_dir), random_weights=True, memory=memory)
    assert [stage for stage, _, _ in calls] == ["samplers", "forward", "forward"]
    sampler_temps, first, second = (temps for _, _, temps in calls)
    assert first > sampler_temps
    assert calls[1][1].kv_cache.shape[1] == _blocks(device_bytes, sampler_temps)
    assert runner.num_blocks == calls[2][1].kv_cache.shape[1] == _blocks(device_bytes, first)
    assert runner.num_blocks < calls[1][1].kv_cache.shape[1]


FIXED_PROBE = MiB  # the probe's answer for the refusals' arithmetic (its measurement is tested above)
KEPT_FOR_PROBE = FIXED_PROBE + 64 * MiB  # what the budget keeps free for it (temp_headroom)


def _memory(device_bytes: int, in_use: int) -> MemoryProbe:
    return MemoryProbe(device_memory=lambda device: (device_bytes, in_use), temp_bytes=lambda *a, **k: FIXED_PROBE)


def test_weights_that_leave_no_room_are_refused_naming_the_flags(tiny_dir):
    # the engine's share (0.9 x 73 KiB) is free, but its own weights and the probe's headroom do not fit in it
    tiny_device = int(KEPT_FOR_PROBE / 0.9) + TINY_WEIGHTS
    with pytest.raises(ValueError, match=r"the weights \(0.00 GiB per device\) and the compiled programs' "
                                         r"temporaries .* raise --tensor-parallel-size or --gpu-memory-utilization"):
        ModelRunner(_accelerator_config(tiny_dir), random_weights=True, memory=_memory(tiny_device, TINY_WEIGHTS))


def test_a_cache_too_small_for_one_request_names_max_model_len(tiny_dir):
    per_block = 2 * 16 * 2 * 2 * 16 * 4
    # room for 10 blocks in the engine's share; max_model_len 256 needs 16 and the null block
    device_bytes = int((TINY_WEIGHTS + KEPT_FOR_PROBE + 10.5 * per_block) / 0.9)
    with pytest.raises(ValueError, match=r"needs 16 KV blocks .* only 9 usable blocks; lower --max-model-len or "
                                         r"raise --gpu-memory-utilization or --tensor-parallel-size"):
        ModelRunner(_accelerator_config(tiny_dir), random_weights=True, memory=_memory(device_bytes, TINY_WEIGHTS))


def test_memory_held_by_others_counts_only_against_what_is_free(tiny_dir):
    """vLLM's --gpu-memory-utilization is one engine's share of the device: two engines at 0.45, or an engine
    beside a trainer, each size their cache from their own weights. Another engine's cache is not this one's
    weights (on an H200, a benchmark's second engine was refused for the first one's 94 GiB cache)."""
    device_bytes, others = 1024 * MiB, 400 * MiB
    per_block = 2 * 16 * 2 * 2 * 16 * 4
    runner = ModelRunner(_accelerator_config(tiny_dir, gpu_memory_utilization=0.5), random_weights=True,
                         memory=_memory(device_bytes, others + TINY_WEIGHTS))
    assert runner.num_blocks == (512 * MiB - TINY_WEIGHTS - KEPT_FOR_PROBE) // per_block
    # a share larger than what the others leave free is refused, naming the flag and what holds the memory
    with pytest.raises(ValueError, match=r"free memory \(0.61 GiB: 0.39 of its 1.0 GiB are held by other arrays.* "
                                         r"lower --gpu-memory-utilization"):
        ModelRunner(_accelerator_config(tiny_dir, gpu_memory_utilization=0.7), random_weights=True,
                    memory=_memory(device_bytes, others + TINY_WEIGHTS))
