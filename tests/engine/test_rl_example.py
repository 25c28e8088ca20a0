"""examples/rl_grpo.py for 3 iterations on a tiny random Llama (docs/rl.md): each update_weights changes what the
engine answers, and after the first iteration (whose rollout and probe compile their programs on first use: the
engine here skips warm-up) nothing compiles, through sleep, update and wake."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams
from vllm_jax.worker.model_runner import ModelRunner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl_grpo.py"


def load_example(monkeypatch):
    spec = importlib.util.spec_from_file_location("rl_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "rl_grpo", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_three_grpo_iterations_change_the_engine_and_compile_nothing_new(tmp_path, monkeypatch):
    make_tiny_checkpoint("llama", tmp_path / "llama", seed=4)
    monkeypatch.setattr(ModelRunner, "warmup", lambda self, show_progress=True: 0.0)
    # the shapes of tests/engine/test_weight_sync.py's engine: its programs come from the session's compilation cache
    llm = LLM(str(tmp_path / "llama"), max_model_len=64, block_size=8, num_gpu_blocks_override=32, max_num_seqs=2,
              max_num_batched_tokens=8, enable_sleep_mode=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    before = llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0.0, max_tokens=4,
                                                                             logprobs=0), use_tqdm=False)[0]
    probe = [d[t].logprob for d, t in zip(before.outputs[0].logprobs, before.outputs[0].token_ids)]
    lines = []
    history = load_example(monkeypatch).run(llm, iterations=3, prompts=prompts, group=2, max_tokens=4, lr=0.05,
                                 log=lines.append)
    for row in history:
        assert row["probe"] != probe, row["iteration"]  # the update reached the engine
        probe = row["probe"]
    assert len({row["compilations"] for row in history}) == 1
    assert history[0]["logprob_gap"] < 1e-3  # the example's trainer scores tokens as the engine does
    assert sum("weight sync" in line for line in lines) == 3
    assert not llm.is_sleeping()
