"""Weight updates and sleep mode (docs/architecture/05-worker.md, "Sleep and weight updates"): an engine started
from checkpoint A and updated with B's tensors answers exactly as a fresh engine on B; a bad update changes
nothing; sleep and wake give the same answers; nothing recompiles. One engine per checkpoint, no warm-up: the
workload's own programs are compiled once, and the trace counter must not move after that."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import EngineArgs, SamplingParams
from vllm_jax.engine.errors import EngineSleepingError
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.model.fused_projections import qkv_layout

ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=32, max_num_seqs=2, max_num_batched_tokens=8,
            enable_sleep_mode=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


def engine_on(path, **extra) -> LLMEngine:
    return LLMEngine(EngineArgs(model=str(path), **{**ARGS, **extra}).create_config(), warmup=False,
                     show_progress=False)


def greedy(engine: LLMEngine) -> list[tuple[list[int], list[list[tuple[int, float]]]]]:
    """Each prompt's greedy tokens and top-2 logprobs."""
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=2, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}-{id(params)}", prompt, params)
    done = {}
    while engine.has_work():
        done.update((out.request_id, out.outputs[0]) for out in engine.step() if out.finished)
    outs = [done[f"r{i}-{id(params)}"] for i in range(len(PROMPTS))]
    return [(list(o.token_ids), [sorted((k, v.logprob) for k, v in d.items()) for d in o.logprobs]) for o in outs]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("weight_sync")
    model_a = make_tiny_checkpoint("llama", root / "a", seed=1)
    make_tiny_checkpoint("llama", root / "b", seed=2)
    return root / "a", root / "b", model_a


@pytest.fixture(scope="module")
def engine(checkpoints):
    return engine_on(checkpoints[0])


@pytest.fixture(scope="module")
def answers(checkpoints, engine):
    """A's answers from the shared engine (compiling its programs) and B's from a fresh engine."""
    on_a = greedy(engine)
    on_b = greedy(engine_on(checkpoints[1]))
    assert on_a != on_b
    return on_a, on_b


def leaves(engine: LLMEngine) -> list[jax.Array]:
    return jax.tree.leaves(nnx.to_pure_dict(engine.runner.params))


def test_update_from_pairs_then_path_equals_fresh_engines_and_compiles_nothing(checkpoints, engine, answers):
    on_a, on_b = answers
    traces = engine.runner.num_compilations
    tensors_b = load_file(str(checkpoints[1] / "model.safetensors"))
    assert engine.update_weights(tensors_b.items()) > 0
    assert greedy(engine) == on_b
    engine.update_weights(str(checkpoints[0]))  # a checkpoint directory
    assert greedy(engine) == on_a
    assert engine.runner.num_compilations == traces


def test_torch_tensors_and_a_partial_update(checkpoints, engine, answers):
    on_a, on_b = answers
    b_layer1 = {k: v for k, v in load_file(str(checkpoints[1] / "model.safetensors")).items()
                if k.startswith("model.layers.1.")}
    engine.update_weights(b_layer1)  # layer 1 only
    state = nnx.to_pure_dict(engine.runner.params)
    q = qkv_layout(engine.runner.spec).split(state["layers"]["qkv_proj"][1])[0]  # model/fused_projections.py
    np.testing.assert_array_equal(np.asarray(q), b_layer1["model.layers.1.self_attn.q_proj.weight"].T)
    mixed = greedy(engine)
    assert mixed not in (on_a, on_b)
    engine.update_weights((name, t) for name, t in checkpoints[2].state_dict().items())  # torch, back to A
    assert greedy(engine) == on_a


def test_bad_name_or_shape_changes_nothing(checkpoints, engine):
    before = leaves(engine)
    good = load_file(str(checkpoints[1] / "model.safetensors"))
    with pytest.raises(ValueError, match="model.layers.7.mlp.up_proj.weight"):
        engine.update_weights(list(good.items()) + [("model.layers.7.mlp.up_proj.weight", np.zeros((128, 64)))])
    bad_shape = dict(good, **{"model.norm.weight": np.ones(65, np.float32)})
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(65,\)"):
        engine.update_weights(bad_shape)
    after = leaves(engine)
    assert all(a is b for a, b in zip(before, after))


def test_jax_array_on_the_params_sharding_is_used_without_a_copy(engine):
    norm = nnx.to_pure_dict(engine.runner.params)["final_norm"]
    fresh = jax.device_put(np.asarray(norm) * 1.0, norm.sharding)
    engine.update_weights([("model.norm.weight", fresh)])
    assert nnx.to_pure_dict(engine.runner.params)["final_norm"] is fresh


def test_sleep_levels_free_the_devices_and_wake_answers_the_same(checkpoints, engine, answers):
    on_a, on_b = answers
    engine.update_weights(str(checkpoints[0]))
    traces = engine.runner.num_compilations
    sleep_mode = engine.runner.sleep_mode
    awake = sleep_mode.device_bytes()
    engine.sleep(level=1)
    assert engine.is_sleeping() and sleep_mode.device_bytes() <= 0.05 * awake
    with pytest.raises(EngineSleepingError, match="sleeping"):
        engine.add_request("asleep", [1, 2, 3])
    engine.wake_up()
    assert not engine.is_sleeping() and greedy(engine) == on_a
    # level 2: the weights are dropped; the caller updates them (here B's), then wakes the KV cache
    engine.sleep(level=2)
    engine.update_weights(str(checkpoints[1]))
    engine.wake_up(tags=["weights"])
    assert engine.is_sleeping()
    engine.wake_up(tags=["kv_cache"])
    assert greedy(engine) == on_b
    assert engine.runner.num_compilations == traces
    engine.update_weights(str(checkpoints[0]))


def test_sleep_is_refused_with_requests_in_flight_and_without_the_flag(checkpoints, engine):
    engine.add_request("busy", [4, 5, 6], SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match="1 request"):
        engine.sleep()
    engine.abort_request("busy")
    while engine.has_work():
        engine.step()
    with pytest.raises(ValueError, match="level"):
        engine.sleep(level=3)
    assert not engine.is_sleeping()
