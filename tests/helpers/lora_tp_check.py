"""LoRA under tensor parallelism on 2 of the session's fake CPU devices (tests/conftest.py): `lora_tp_check(WORKDIR)`
returns the greedy tokens of a mixed base / adapter batch at TP 1 and TP 2 (and peft's) and the TP 2 slots'
shardings, JSON-shaped."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.helpers.parallel_workload import ENGINE_ARGS, prompts
from tests.helpers.tiny_models import hf_greedy, make_tiny_checkpoint

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _spec(array) -> list:
    parts = list(array.sharding.spec)
    while parts and parts[-1] is None:
        parts.pop()
    return parts


def lora_tp_check(workdir: Path) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    from vllm_jax import LLM, LoRARequest, SamplingParams

    base = make_tiny_checkpoint("llama", workdir / "base", seed=1)
    refs = {None: base}
    for i, name in enumerate("AB"):
        torch.manual_seed(10 + i)
        refs[name] = get_peft_model(copy.deepcopy(base), LoraConfig(
            r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)).eval()
        refs[name].save_pretrained(workdir / name)
    loras = {None: None, **{n: LoRARequest(n, i + 1, str(workdir / n)) for i, n in enumerate("AB")}}
    names = ["A", None, "B"]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    result: dict = {"peft": [hf_greedy(refs[n], p, 10) for n, p in zip(names, prompts())]}
    for tp in (1, 2):
        llm = LLM(str(workdir / "base"), tensor_parallel_size=tp, enable_lora=True, max_loras=2, max_lora_rank=8,
                  **ENGINE_ARGS)
        outs = llm.generate(prompts(), params, use_tqdm=False, lora_request=[loras[n] for n in names])
        result[f"tp{tp}"] = [o.outputs[0].token_ids for o in outs]
        if tp == 2:
            arrays = llm.llm_engine.runner.device.lora.arrays
            result["specs"] = {name: [_spec(a), _spec(b)] for name, (a, b) in arrays.items()}
        del llm
    return json.loads(json.dumps(result))

