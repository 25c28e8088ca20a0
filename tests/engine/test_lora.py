"""Multi-LoRA serving (docs/architecture/11-lora.md, "LoRA adapters").

The oracle is transformers + peft: tiny random Llama and Qwen3 checkpoints, random PEFT adapters built here
(init_lora_weights=False, so lora_B is not zero and every adapter changes the output), each request's greedy tokens
compared with peft running that adapter alone. Two engines in all (warm-up dominates the time).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.numpy import load_file, save_file

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax import LLM, EngineArgs, LoRARequest, SamplingParams
from vllm_jax.config import add_engine_args, engine_args_from_namespace
from vllm_jax.lora.adapter import TargetShapes, load_peft_adapter
from vllm_jax.lora.config import LoRAConfig, parse_lora_modules
from vllm_jax.lora.slots import LoRASlots
from vllm_jax.model.layers import linear
from vllm_jax.model.weight_forms.dense import DenseWeight
from vllm_jax.model.weight_forms.lora import LoRAAdapter, LoRAMask, LoRAWeight
from vllm_jax.paged_kv.block_hash import extend_block_hashes
from vllm_jax.worker.input_batch import InputBatch

MAX_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# one bucket (docs/contributing/testing.md, "Compile time"): one forward and one sampler set to compile
ENGINE = dict(max_model_len=128, num_gpu_blocks_override=64, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
              min_token_bucket=32, min_seq_bucket=8)
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base, path: Path, seed: int, r: int, targets: list[str], **config):
    """A random PEFT adapter on a copy of `base` (lora_alpha 2r unless given), saved to `path`; returns the peft
    model (the reference)."""
    torch.manual_seed(seed)
    config = {"lora_alpha": 2 * r, **config}
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=r, target_modules=targets, init_lora_weights=False,
                                                           **config)).eval()
    model.save_pretrained(path)
    return model


def prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, n).tolist() for n in lengths]


def assert_idle(llm: LLM) -> None:
    engine = llm.llm_engine
    assert not engine.has_work()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks - 1
    assert engine.scheduler.lora_slots.num_pinned == 0


# ---- Llama: a mixed batch, the prefix cache, bad input -----------------------------------------------------

@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_llama")
    base = make_tiny_checkpoint("llama", root / "base")
    refs = {None: base,
            "A": make_adapter(base, root / "A", 1, 8, ["q_proj", "v_proj", "o_proj", "down_proj"]),
            "B": make_adapter(base, root / "B", 2, 4, ["k_proj", "gate_proj", "up_proj"], use_rslora=True),
            "C": make_adapter(base, root / "C", 3, 8, ALL_TARGETS)}
    llm = LLM(str(root / "base"), enable_lora=True, max_loras=2, max_lora_rank=8, max_cpu_loras=2, **ENGINE)
    requests = {name: LoRARequest(name, i, str(root / name)) for i, name in enumerate("ABC", start=1)}
    return root, llm, refs, requests


def test_mixed_batch_matches_peft_per_adapter(llama):
    """Base, A and B requests in one batch: each gets peft's greedy tokens with its adapter alone; nothing
    compiles after warm-up, and everything is free afterwards."""
    _, llm, refs, lora = llama
    names = [None, "A", "B", None, "A", "B"]
    ps = prompts(2, (7, 12, 5, 20, 3, 9))
    compiles = llm.llm_engine.runner.num_compilations
    outs = llm.generate(ps, GREEDY, use_tqdm=False, lora_request=[lora[n] if n else None for n in names])
    expected = [hf_greedy(refs[n], p, MAX_TOKENS) for n, p in zip(names, ps)]
    assert [o.outputs[0].token_ids for o in outs] == expected
    # the adapters matter: the base model continues these prompts differently
    base = [hf_greedy(refs[None], p, MAX_TOKENS) for p in ps[1:3]]
    assert base[0] != expected[1] and base[1] != expected[2]
    assert llm.llm_engine.runner.num_compilations == compiles
    assert_idle(llm)


def test_adapters_apply_through_the_unrolled_layer_loop(llama):
    """--no-scan-layers (the GPU's default loop): each layer's adapter weights are picked by a Python index."""
    root, _, refs, lora = llama
    llm = LLM(str(root / "base"), enable_lora=True, max_loras=2, max_lora_rank=8, max_cpu_loras=2,
              scan_layers=False, **ENGINE)
    names = [None, "A", "B"]
    ps = prompts(4, (6, 11, 9))
    outs = llm.generate(ps, GREEDY, use_tqdm=False, lora_request=[lora[n] if n else None for n in names])
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(refs[n], p, MAX_TOKENS) for n, p in zip(names, ps)]
    assert_idle(llm)


def test_a_third_adapter_evicts_an_unpinned_slot_without_compiling(llama):
    """max_loras=2: C takes the least recently used slot once nothing runs on it; a request for A after that
    reloads A (the host cache holds two), all without a compilation."""
    _, llm, refs, lora = llama
    compiles = llm.llm_engine.runner.num_compilations
    for name in ("C", "A", "B", "C"):
        p = prompts(ord(name), (6,))[0]
        out = llm.generate([p], GREEDY, use_tqdm=False, lora_request=lora[name])[0]
        assert out.outputs[0].token_ids == hf_greedy(refs[name], p, MAX_TOKENS), name
    slots = llm.llm_engine.scheduler.lora_slots
    assert len(slots.resident) == 2 and 3 in slots.resident  # C, and the most recent before it (B)
    assert llm.llm_engine.runner.num_compilations == compiles
    assert_idle(llm)


def test_prefix_cache_is_not_shared_across_adapters(llama):
    _, llm, _, lora = llama
    llm.reset_prefix_cache()
    p = prompts(5, (33,))[0]
    params = SamplingParams(temperature=0.0, max_tokens=2)
    first = llm.generate([p], params, use_tqdm=False)[0]
    with_a = llm.generate([p], params, use_tqdm=False, lora_request=lora["A"])[0]
    again_a = llm.generate([p], params, use_tqdm=False, lora_request=lora["A"])[0]
    with_b = llm.generate([p], params, use_tqdm=False, lora_request=lora["B"])[0]
    assert first.num_cached_tokens == 0
    assert with_a.num_cached_tokens == 0  # the base model's blocks hold other KV
    assert again_a.num_cached_tokens == 32  # A's own blocks: four full blocks of 8
    assert with_b.num_cached_tokens == 0
    assert_idle(llm)


def _broken_adapter(root: Path, name: str, source: Path, edit) -> Path:
    path = root / name
    shutil.copytree(source, path, dirs_exist_ok=True)
    edit(path)
    return path


def test_bad_adapters_are_refused_with_nothing_loaded(llama):
    root, llm, refs, lora = llama
    engine = llm.llm_engine
    too_big = root / "rank16"
    make_adapter(refs[None], too_big, 4, 16, ["q_proj"])

    def drop_weights(path: Path) -> None:
        (path / "adapter_model.safetensors").unlink()

    def lm_head_target(path: Path) -> None:
        tensors = load_file(str(path / "adapter_model.safetensors"))
        tensors = {k.replace("layers.0.self_attn.q_proj", "lm_head"): v for k, v in tensors.items()}
        save_file(tensors, str(path / "adapter_model.safetensors"))

    def list_fc1(path: Path) -> None:
        config = json.loads((path / "adapter_config.json").read_text())
        config["target_modules"] = ["q_proj", "fc1"]
        (path / "adapter_config.json").write_text(json.dumps(config))

    cases = {
        "rank 16 is larger than max_lora_rank (8)": too_big,
        "adapter_model.safetensors is missing": _broken_adapter(root, "nofile", root / "A", drop_weights),
        "the model has no such target module": _broken_adapter(root, "lmhead", root / "A", lm_head_target),
        "target modules ['fc1'] are not in the model": _broken_adapter(root, "fc1", root / "A", list_fc1),
        "is not a directory": root / "nowhere",
    }
    for i, (message, path) in enumerate(cases.items(), start=50):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False, lora_request=LoRARequest(f"bad{i}", i, str(path)))
        assert i not in engine.runner.lora_cache
    with pytest.raises(ValueError, match="lora_int_id must be an integer >= 1"):
        LoRARequest("zero", 0, str(root / "A"))
    engine.runner.lora_cache.get(lora["A"])
    with pytest.raises(ValueError, match="lora_int_id 1 is adapter 'A', not 'other'"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False, lora_request=LoRARequest("other", 1, str(root / "B")))
    assert not engine.scheduler.lora_slots.pins
    assert_idle(llm)


# ---- Qwen3, one slot: requests wait for it ------------------------------------------------------------------

def test_qwen3_one_slot_requests_wait_for_it(tmp_path):
    """max_loras=1: with A's requests running, a B request stays waiting (not failed) while base requests go
    ahead; every request still gets peft's tokens, and nothing compiles."""
    base = make_tiny_checkpoint("qwen3", tmp_path / "base")
    refs = {None: base, "A": make_adapter(base, tmp_path / "A", 5, 4, ALL_TARGETS),
            "B": make_adapter(base, tmp_path / "B", 6, 8, ["q_proj", "k_proj", "down_proj"], lora_alpha=4)}
    llm = LLM(str(tmp_path / "base"), enable_lora=True, max_lora_rank=8, **ENGINE)
    engine = llm.llm_engine
    lora = {n: LoRARequest(n, i, str(tmp_path / n)) for i, n in enumerate("AB", start=1)}
    names = ["A", "B", None, "A"]
    ps = prompts(7, (9, 6, 4, 11))
    compiles = engine.runner.num_compilations
    for i, (name, p) in enumerate(zip(names, ps)):
        engine.add_request(str(i), p, GREEDY, lora_request=lora[name] if name else None)
    outputs = {}
    engine.step()
    assert {r.request_id for r in engine.scheduler.running} == {"0", "2", "3"}
    assert [r.request_id for r in engine.scheduler.waiting] == ["1"]
    while engine.has_work():
        outputs.update({o.request_id: o for o in engine.step() if o.finished})
    for i, (name, p) in enumerate(zip(names, ps)):
        assert outputs[str(i)].outputs[0].token_ids == hf_greedy(refs[name], p, MAX_TOKENS), name
    assert engine.runner.num_compilations == compiles
    assert_idle(llm)


# ---- pieces ------------------------------------------------------------------------------------------------

def test_lora_delta_equals_per_token_adapter_product():
    """The masked all-slots formulation equals gathering each token's own (a, b): x @ a[s] @ b[s]."""
    rng = np.random.default_rng(0)
    t, fin, fout, n, r = 11, 24, 40, 4, 8
    x = rng.standard_normal((t, fin)).astype(np.float32)
    w = rng.standard_normal((fin, fout)).astype(np.float32)
    a = rng.standard_normal((n, fin, r)).astype(np.float32)
    b = rng.standard_normal((n, r, fout)).astype(np.float32)
    a[0], b[0] = 0, 0
    slots = rng.integers(0, n, t).astype(np.int32)
    def run(slots):
        weight = LoRAWeight(DenseWeight(jnp.asarray(w)),
                            LoRAAdapter(jnp.asarray(a), jnp.asarray(b), LoRAMask.of(jnp.asarray(slots), n)))
        return np.asarray(jax.jit(lambda x: linear(x, weight))(jnp.asarray(x)))

    np.testing.assert_allclose(run(slots), x @ w + np.einsum("ti,tir,tro->to", x, a[slots], b[slots]),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run(np.zeros(t, np.int32)), x @ w, rtol=1e-4, atol=1e-4)  # no adapter: skipped


def test_loader_folds_scaling_into_b(tmp_path):
    """lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; a [L, in, r], b [L, r, out]."""
    base = make_tiny_checkpoint("llama", tmp_path / "base")
    shapes = TargetShapes(2, {"q_proj": (64, 64), "k_proj": (64, 32), "v_proj": (64, 32), "o_proj": (64, 64),
                              "gate_proj": (64, 128), "up_proj": (64, 128), "down_proj": (128, 64)})
    for rslora in (False, True):
        path = tmp_path / f"rs{rslora}"
        make_adapter(base, path, 0, 4, ["k_proj"], use_rslora=rslora)
        adapter = load_peft_adapter(LoRARequest("x", 1, str(path)), shapes, max_rank=8)
        tensors = load_file(str(path / "adapter_model.safetensors"))
        scaling = 8 / math.sqrt(4) if rslora else 8 / 4
        assert adapter.scaling == scaling and set(adapter.weights) == {"k_proj"}
        a, b = adapter.weights["k_proj"]
        assert a.shape == (2, 64, 4) and b.shape == (2, 4, 32)
        key = "base_model.model.model.layers.1.self_attn.k_proj.lora_{}.weight"
        np.testing.assert_allclose(a[1], tensors[key.format("A")].T)
        np.testing.assert_allclose(b[1], tensors[key.format("B")].T * scaling, rtol=1e-6)


def test_slots_are_lru_over_unpinned_adapters():
    slots = LoRASlots(2)
    a, b, c = (LoRARequest(n, i) for i, n in enumerate("abc", start=1))
    assert slots.acquire(a) == (1, True) and slots.acquire(b) == (2, True)
    assert slots.acquire(a) == (1, False)  # resident: no write
    assert not slots.can_acquire(c)  # both pinned: c waits
    slots.release(b)
    assert slots.can_acquire(c) and slots.acquire(c) == (2, True)  # b's slot, the only unpinned one
    slots.release(a)
    slots.release(a)
    slots.release(c)
    assert slots.acquire(b) == (1, True)  # a was used less recently than c
    with pytest.raises(RuntimeError):
        slots.release(a)


def test_block_hashes_key_on_the_adapter():
    tokens = list(range(20))
    base, a, b = ([] for _ in range(3))
    extend_block_hashes(base, tokens, 8)
    extend_block_hashes(a, tokens, 8, lora_int_id=1)
    extend_block_hashes(b, tokens, 8, lora_int_id=2)
    assert len(base) == len(a) == 2
    assert not set(base) & set(a) and not set(a) & set(b)
    assert extend_block_hashes([], tokens, 8, lora_int_id=1) == a


def test_flags_and_modules():
    assert parse_lora_modules(["a=/x", '{"name": "b", "path": "/y", "base_model_name": "m"}']) == (
        LoRARequest("a", 1, "/x"), LoRARequest("b", 2, "/y"))
    with pytest.raises(ValueError, match="repeat"):
        parse_lora_modules(["a=/x", "a=/y"])
    assert LoRAConfig.create(4, 16, None, None).max_cpu_loras == 4
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoRAConfig.create(4, 16, 2, None)
    with pytest.raises(ValueError, match="max_loras"):
        LoRAConfig.create(0, 16, None, None)
    with pytest.raises(ValueError, match="lora_modules needs enable_lora"):
        EngineArgs(model="x", lora_modules=["a=/x"])._lora_config()
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    ns = parser.parse_args(["--enable-lora", "--max-loras", "4", "--lora-modules", "a=/x", "b=/y"])
    args = engine_args_from_namespace(ns, "m")
    assert (args.enable_lora, args.max_loras, args._lora_config().lora_modules) == (
        True, 4, (LoRARequest("a", 1, "/x"), LoRARequest("b", 2, "/y")))


def test_without_lora_the_step_carries_no_slot_array():
    """enable_lora off: StepInputs.lora_slots stays None, so the forward's inputs are exactly as before."""
    batch = InputBatch(4, 64, 8, VOCAB_SIZE)
    batch.add("r", [1, 2, 3], [1], 0, SamplingParams(), 0)
    inputs = batch.pack(batch.slots(["r"]), np.array([3]), block_size=8, num_tokens_padded=8, num_seqs_padded=2)
    assert inputs.lora_slots is None
    with_lora = InputBatch(4, 64, 8, VOCAB_SIZE, lora=True)
    with_lora.add("r", [1, 2, 3], [1], 0, SamplingParams(), 0, lora_slot=2)
    inputs = with_lora.pack(with_lora.slots(["r"]), np.array([3]), block_size=8, num_tokens_padded=8,
                            num_seqs_padded=2)
    assert inputs.lora_slots.tolist() == [2, 2, 2, 0, 0, 0, 0, 0]
