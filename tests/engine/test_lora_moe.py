"""LoRA on mixture-of-experts models (docs/architecture/11-lora.md, "Mixture-of-experts models").

The oracle is transformers + peft on tiny random Mixtral and Qwen3-MoE: adapters made by peft on attention and on
the fused experts tensors (target_parameters: the fused 3-D layout); expert adapters in PEFT's per-expert layout
(`experts.{e}.w1` / `experts.{e}.gate_proj` ..., one A/B per expert), which peft cannot make on transformers 5's
fused expert tensors, written here and checked against transformers running the base model with each expert's
B A scaling merged into its weights. Each request's greedy tokens in a batch mixing base and adapter requests equal
the reference's with that adapter alone. One engine per model, no warm-up (only the programs this workload runs
compile)."""

from __future__ import annotations

import pytest

from tests.helpers.lora_moe_models import MAX_TOKENS, greedy, make_engine, make_models, prompts
from tests.helpers.tiny_models import hf_greedy


@pytest.fixture(scope="module", params=["mixtral", "qwen3_moe"])
def moe(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"lora_{request.param}")
    refs = make_models(root, request.param)
    engine, loras = make_engine(root)
    return engine, refs, loras


def test_attention_and_expert_adapters_in_a_mixed_batch_match_the_references(moe):
    """Base, an attention adapter, a per-expert one and a fused-experts one in one batch (two slots: one adapter
    waits for a slot): each request gets its reference's tokens alone, and the adapters matter."""
    engine, refs, loras = moe
    names = ["A", None, "E", "F", "E"]
    ps = prompts(4, (6, 11, 5, 9, 12))
    out = greedy(engine, ps, [loras[n] for n in names])
    assert out == [hf_greedy(refs[n], p, MAX_TOKENS) for n, p in zip(names, ps)]
    base = [hf_greedy(refs[None], p, MAX_TOKENS) for p in ps[2:4]]
    assert base[0] != out[2] and base[1] != out[3]
    assert engine.scheduler.lora_slots.num_pinned == 0


def test_unsupported_expert_layouts_are_named(tmp_path):
    """A fused experts pair missing B, an experts tensor of no layout, an expert the model lacks, and expert
    tensors for a dense model: clear errors naming the tensor."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from vllm_jax.lora.adapter import TargetShapes, load_peft_adapter
    from vllm_jax.lora.request import LoRARequest

    moe = TargetShapes(2, {"q_proj": (8, 8), "experts_gate": (8, 4)}, num_experts=2)
    dense = TargetShapes(2, {"q_proj": (8, 8)})
    prefix = "base_model.model.model.layers.0.mlp.experts"
    cases = [(f"{prefix}.lora_A.weight", moe, "fused experts tensor (lora_A/B) has lora_A only"),
             (f"{prefix}.gate.lora_A.weight", moe, "in no experts layout read here"),
             (f"{prefix}.2.gate_proj.lora_A.weight", moe, "names expert 2, but the model has 2"),
             (f"{prefix}.0.gate_proj.lora_A.weight", dense, "the model has no experts")]
    for i, (key, shapes, message) in enumerate(cases):
        path = tmp_path / str(i)
        path.mkdir()
        save_file({key: np.zeros((2, 8), np.float32)}, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4}))
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_peft_adapter(LoRARequest("x", 1, str(path)), shapes, 8)


def test_other_moe_families_are_refused_by_name():
    from types import SimpleNamespace

    from vllm_jax.worker.engine_builder import check_lora_supported

    with pytest.raises(ValueError, match="LoRA on DeepseekV3ForCausalLM is not supported yet"):
        check_lora_supported(SimpleNamespace(num_experts=4, architecture="DeepseekV3ForCausalLM"))
