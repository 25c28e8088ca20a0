"""gpt-oss (GptOssForCausalLM) against transformers on one tiny random checkpoint (3 layers: sliding window 5 on
layers 0 and 2, full on 1; 4 experts top-2; YaRN rope; random sinks and expert / router biases; a SwiGLU limit of
0.5 that clamps often), plus what gpt-oss refuses and its chat-template kwargs. TP / EP:
tests/multidevice/test_sharding.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers.parity import assert_logits_match_over_two_chunked_steps, load_forward, ragged_sequences
from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams

MAX_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_oss")
    return path, make_tiny_checkpoint("gpt_oss", path, seed=3)


def test_logits_match_transformers_on_ragged_chunked_batches(checkpoint):
    """Two chunked steps over four ragged sequences (the second chunk reads the first's pages; windows cut in): every
    computed position within 1e-4, layers scanned and unrolled. The checkpoint really exercises gpt-oss's parts: every
    expert routed in every layer, the clamp active, the sinks large."""
    path, hf = checkpoint
    spec = load_forward(path)[0]
    assert spec.sliding_windows == (5, 0, 5) and spec.rope_attention_scaling > 1.0
    seqs = ragged_sequences()
    with torch.no_grad():
        out = hf(torch.tensor([sum(seqs, [])]), output_router_logits=True)
    for logits in out.router_logits:
        assert set(torch.topk(logits, 2, dim=-1).indices.unique().tolist()) == set(range(4))
    gate_up = hf.model.layers[0].mlp.experts.gate_up_proj
    assert float(hf.model.layers[0].self_attn.sinks.detach().abs().max()) > 1.0 and gate_up.shape[-1] == 2 * 48
    assert_logits_match_over_two_chunked_steps(hf, path, seqs)
    assert_logits_match_over_two_chunked_steps(hf, path, seqs, layers="unrolled")  # --no-scan-layers' loop


@pytest.fixture(scope="module")
def llm(checkpoint):
    """One engine for the generation tests (warm-up dominates their time): 16 usable blocks of 8 tokens, fewer
    than the first batch's three requests need at once (18), so the scheduler preempts."""
    return LLM(str(checkpoint[0]), max_model_len=128, block_size=8, num_gpu_blocks_override=17, max_num_seqs=8,
               max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=8)  # one bucket: one forward


def test_greedy_32_tokens_under_preemption_and_prefix_cache_hits_equal_transformers(checkpoint, llm):
    """Prompts of 7, 30 and 1 tokens (past the window) through LLM.generate with a KV cache that forces
    preemption: greedy continuations token-identical to HF's; then a shared-prefix family, its later members
    hitting the prefix cache, gives HF's tokens too."""
    _, hf = checkpoint
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 30, 1)]
    shared = rng.integers(3, VOCAB_SIZE, 24).tolist()
    family = [shared + rng.integers(3, VOCAB_SIZE, 3).tolist() for _ in range(3)]
    want = [hf_greedy(hf, p, MAX_TOKENS) for p in prompts + family]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == want[:3]
    assert llm.llm_engine.scheduler.num_preemptions_total > 0
    manager = llm.llm_engine.kv_cache_manager
    got = [o.outputs[0].token_ids for o in llm.generate(family[:1], GREEDY, use_tqdm=False)]
    hits = manager.prefix_cache_hits
    got += [o.outputs[0].token_ids for o in llm.generate(family[1:], GREEDY, use_tqdm=False)]
    assert got == want[3:] and manager.prefix_cache_hits > hits


HARMONY_LIKE = (
    "<|start|>system<|message|>{{ model_identity | default('You are ChatGPT') }}\nReasoning: "
    "{{ reasoning_effort | default('medium') }}\n{% if builtin_tools %}Tools: {{ builtin_tools | join(', ') }}"
    "{% endif %}<|end|>{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}")


def test_chat_applies_a_harmony_like_template_with_gpt_oss_kwargs(llm):
    """gpt-oss's chat format (harmony) comes from its tokenizer's template, which reads extra kwargs
    (reasoning_effort, model_identity, builtin_tools): LLM.chat passes them through and the prompt is the
    template's rendering; a kwarg that would override LLM.chat's own arguments is refused."""
    tokenizer = llm.get_tokenizer()
    tokenizer.chat_template = HARMONY_LIKE
    messages = [{"role": "user", "content": "hi"}]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    kwargs = {"reasoning_effort": "low", "model_identity": "tiny", "builtin_tools": ["python"]}
    out = llm.chat(messages, params, use_tqdm=False, chat_template_kwargs=kwargs)
    prompt = tokenizer.decode(out[0].prompt_token_ids)
    assert prompt == ("<|start|>system<|message|>tiny\nReasoning: low\nTools: python<|end|>"
                      "<|start|>user<|message|>hi<|end|><|start|>assistant")
    assert len(out[0].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match="may not set tokenize"):
        llm.chat(messages, params, use_tqdm=False, chat_template_kwargs={"tokenize": False})


def test_other_quantization_methods_and_int8_are_refused_naming_them(checkpoint, tmp_path):
    """MXFP4 experts load (tests/engine/test_gpt_oss_mxfp4.py); any other quant_method and --quantization int8 do
    not."""
    from vllm_jax.model.registry import resolve_architecture
    from vllm_jax.model_loader.source import load_hf_config, resolve_model_source

    path, _ = checkpoint
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quant_method 'bitsandbytes' is not supported"):
        resolve_architecture(load_hf_config(resolve_model_source(str(tmp_path))))
    with pytest.raises(ValueError, match="--quantization int8 is not supported for gpt-oss"):
        LLM(str(path), max_model_len=64, quantization="int8", num_gpu_blocks_override=16)
