"""Qwen2.5-VL through LLM.generate and the engine on a tiny random checkpoint: greedy tokens equal transformers'
generate with one and two images while prefills split inside images (a 16-token budget) and requests are preempted
(a small KV cache), prefix caching keyed by the image, the encoder cache, bad input refused (TP 2 = TP 1:
tests/multidevice/test_qwen2_5_vl_engine_tp.py)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.vl_models import (
    IMAGE_PAD,
    PLACEHOLDER,
    expand_placeholders,
    image_processor,
    make_vl_checkpoint,
    random_image,
)
from vllm_jax import LLM, SamplingParams

# 16-token budget: prefills split inside images; 14 blocks of 8: the three prompts of the greedy test preempt
# one bucket (docs/contributing/testing.md, "Compile time"), TP 1 and TP 2 alike
ARGS = dict(max_model_len=96, num_gpu_blocks_override=14, block_size=8, max_num_seqs=4, max_num_batched_tokens=16,
            min_token_bucket=16, min_seq_bucket=4)
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_5_vl_engine")
    return path, make_vl_checkpoint(path, seed=7)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint[0]), **ARGS)


@pytest.fixture(scope="module")
def engine(llm):
    return llm.llm_engine


def _run(engine, prompts: list[dict]) -> list:
    """Every prompt added at once (they share steps and the token budget); their final outputs in order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{id(prompts)}-{i}", prompt, GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        done.update((out.request_id, out) for out in engine.step() if out.finished)
    return [done[f"r{id(prompts)}-{i}"] for i in range(len(prompts))]


def _hf_greedy(hf, engine, prompt: str, images: list) -> list[int]:
    ids = engine.tokenizer.encode(prompt)
    kwargs, grids = {}, []
    if images:
        processed = image_processor()(images=images, return_tensors="pt")
        grids = [tuple(int(x) for x in g) for g in processed["image_grid_thw"]]
        kwargs = dict(pixel_values=processed["pixel_values"], image_grid_thw=processed["image_grid_thw"])
    t = torch.tensor([expand_placeholders(ids, grids)])
    if images:
        kwargs["mm_token_type_ids"] = (t == IMAGE_PAD).int()
    with torch.no_grad():
        out = hf.generate(input_ids=t, attention_mask=torch.ones_like(t), **kwargs, max_new_tokens=16,
                          min_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, t.shape[1]:].tolist()


def test_greedy_equals_transformers_with_prefills_chunked_inside_images_and_preemption(checkpoint, llm, engine):
    hf = checkpoint[1]
    big, small, tall = random_image(170, 150, 1), random_image(100, 80, 2), random_image(60, 150, 3)
    cases = [("ab" + PLACEHOLDER + "cd", [big]),  # 30 image tokens: the 16-token budget splits them
             ("x" + PLACEHOLDER + "y" + PLACEHOLDER + "z", [small, tall]),
             ("just text", [])]
    prompts = [{"prompt": p, "multi_modal_data": {"image": imgs}} if imgs else {"prompt": p} for p, imgs in cases]
    preemptions, compilations = engine.scheduler.num_preemptions_total, engine.runner.num_compilations
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert engine.scheduler.num_preemptions_total > preemptions  # recomputed prompts re-read their images
    assert engine.runner.num_compilations == compilations  # warm-up compiled the steps with their image arrays
    assert engine.runner.multimodal.encode._cache_size() == 0  # every image ran a warmed-up encoder executable
    for (prompt, images), out in zip(cases, outs):
        assert out.outputs[0].token_ids == _hf_greedy(hf, engine, prompt, images), prompt


def test_prefix_cache_keys_include_the_image(engine):
    text = "abcdefgh" * 2 + PLACEHOLDER + "tail"
    first, second = random_image(100, 80, 11), random_image(100, 80, 12)
    runner = engine.runner
    calls = runner.multimodal.num_encoder_calls
    (a,) = _run(engine, [{"prompt": text, "multi_modal_data": {"image": first}}])
    (b,) = _run(engine, [{"prompt": text, "multi_modal_data": {"image": second}}])
    (c,) = _run(engine, [{"prompt": text, "multi_modal_data": {"image": first}}])
    assert a.outputs[0].token_ids != b.outputs[0].token_ids
    # the 16 text tokens before the image (two blocks) are shared; nothing from the image's blocks on
    assert b.num_cached_tokens == 16
    assert c.num_cached_tokens > 16 and c.outputs[0].token_ids == a.outputs[0].token_ids
    assert runner.multimodal.num_encoder_calls == calls + 2  # the third request recomputed nothing of the image


def test_bad_multimodal_input_is_refused(engine):
    image = random_image(100, 80, 4)
    with pytest.raises(ValueError, match=r"1 image placeholder\(s\).*but 2 image\(s\)"):
        engine.add_request("bad1", {"prompt": "a" + PLACEHOLDER, "multi_modal_data": {"image": [image, image]}},
                           GREEDY)
    with pytest.raises(ValueError, match="no image in multi_modal_data"):
        engine.add_request("bad2", {"prompt": "a" + PLACEHOLDER}, GREEDY)
    with pytest.raises(ValueError, match="unsupported modality"):
        engine.add_request("bad3", {"prompt": "a", "multi_modal_data": {"video": image}}, GREEDY)
    assert not engine.has_unfinished_requests()


def test_images_refused_by_a_text_only_model(tmp_path):
    from tests.helpers.tiny_models import make_tiny_checkpoint
    from vllm_jax.model.registry import resolve_architecture
    from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
    from vllm_jax.multimodal.capabilities import max_images_per_prompt, supports_images
    from vllm_jax.multimodal.requests import ImagePrompts

    make_tiny_checkpoint("qwen2", tmp_path)
    config = load_hf_config(resolve_model_source(str(tmp_path)))
    assert not supports_images(config) and max_images_per_prompt(config) == 0
    prompts = ImagePrompts(resolve_architecture(config)[1], str(tmp_path))
    with pytest.raises(ValueError, match="has no vision tower"):
        prompts.prepare({"prompt": "a", "multi_modal_data": {"image": random_image(30, 30, 0)}}, [1])
