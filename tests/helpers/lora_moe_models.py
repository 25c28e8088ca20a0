"""Adapters and engines for the LoRA-on-MoE tests (tests/engine/test_lora_moe.py, test_lora_moe_tp.py): random peft
adapters (attention, and the fused experts tensors through target_parameters), random expert adapters in PEFT's
per-expert layout with their merged reference, greedy runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from safetensors.numpy import save_file

from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint
from vllm_jax import EngineArgs, LoRARequest, SamplingParams
from vllm_jax.engine.llm_engine import LLMEngine

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# one bucket (docs/contributing/testing.md, "Compile time"): every step runs the same program, TP 1 and TP 2 alike
ENGINE = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=64, max_num_seqs=4, max_num_batched_tokens=32,
              min_token_bucket=32, min_seq_bucket=4)


def peft_adapter(base, path: Path, seed: int, r: int, targets: list[str], parameters: list[str] | None = None):
    """A random PEFT adapter (lora_B not zero) on a copy of `base`, saved to `path`; the peft model. `parameters`:
    peft's target_parameters (the fused experts tensors)."""
    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                                                           target_parameters=parameters,
                                                           init_lora_weights=False)).eval()
    model.save_pretrained(path)
    return model


def expert_adapter(base, arch: str, path: Path, seed: int, r: int):
    """A random adapter on every expert's gate / up / down in PEFT's per-expert layout (Mixtral's w1 / w3 / w2
    under block_sparse_moe, Qwen3-MoE's gate_proj / up_proj / down_proj under mlp), saved to `path`; the base model
    with the deltas merged (the reference)."""
    rng = np.random.default_rng(seed)
    names = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2")}.get(arch, ("mlp", "gate_proj", "up_proj", "down_proj"))
    scaling, merged, tensors = 2.0, copy.deepcopy(base), {}
    for layer_index, layer in enumerate(merged.model.layers):
        experts = layer.mlp.experts
        size = experts.down_proj.shape[-1]
        with torch.no_grad():
            for e in range(experts.gate_up_proj.shape[0]):
                for module, rows in zip(names[1:], (slice(0, size), slice(size, 2 * size), None)):
                    w = experts.gate_up_proj[e, rows] if rows is not None else experts.down_proj[e]
                    a = rng.normal(0, 0.3, (r, w.shape[1])).astype(np.float32)
                    b = rng.normal(0, 0.3, (w.shape[0], r)).astype(np.float32)
                    w += torch.from_numpy(scaling * b @ a)
                    key = f"base_model.model.model.layers.{layer_index}.{names[0]}.experts.{e}.{module}"
                    tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": scaling * r,
                                                          "target_modules": list(names[1:])}))
    return merged


def prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, n).tolist() for n in lengths]


def greedy(engine: LLMEngine, ps: list[list[int]], loras: list[LoRARequest | None]) -> list[list[int]]:
    for i, (p, lora) in enumerate(zip(ps, loras)):
        engine.add_request(str(i), p, GREEDY, lora_request=lora)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        tokens.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
    return [tokens[str(i)] for i in range(len(ps))]


def make_models(root: Path, arch: str) -> dict:
    """The base checkpoint and three adapters under `root`: A on attention (peft), E on the experts in the
    per-expert layout, F (peft) on k_proj and the fused experts tensors; the references by name (None: the base
    model)."""
    base = make_tiny_checkpoint(arch, root / "base", seed=3)
    return {None: base, "A": peft_adapter(base, root / "A", 1, 8, ["q_proj", "v_proj", "o_proj"]),
            "E": expert_adapter(base, arch, root / "E", 3, 4),
            "F": peft_adapter(base, root / "F", 2, 4, ["k_proj"], ["mlp.experts.gate_up_proj",
                                                                   "mlp.experts.down_proj"])}


def make_engine(root: Path, **args) -> tuple[LLMEngine, dict]:
    """An engine on root/base with two adapter slots (no warm-up) and the LoRARequests by name."""
    engine = LLMEngine(EngineArgs(model=str(root / "base"), enable_lora=True, max_loras=2, max_lora_rank=8,
                                  **ENGINE, **args).create_config(), warmup=False, show_progress=False)
    return engine, {None: None, **{n: LoRARequest(n, i, str(root / n)) for i, n in enumerate("AEF", start=1)}}
