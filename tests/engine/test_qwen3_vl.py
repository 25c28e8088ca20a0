"""Qwen3-VL against transformers (PyTorch CPU, float32) on one tiny random checkpoint: the logits at prompt
positions within 1e-4 for one image and two images of different sizes (the vision tower with its learned
position table resampled to each grid, DeepStack, interleaved M-RoPE, q/k norms); then through the engine
(one LLM for the module): greedy tokens equal transformers' generate while prefills split inside images, the
prefix cache keyed by the image, an image_pil chat part (TP 2 = TP 1: tests/multidevice/test_qwen3_vl_tp.py)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from tests.helpers.vl3_models import image_processor, make_qwen3_vl_checkpoint
from tests.helpers.vl_models import (
    IMAGE_PAD,
    PLACEHOLDER,
    VISION_END,
    VISION_START,
    expand_placeholders,
    hf_logits,
    random_image,
)
from vllm_jax import LLM, SamplingParams
from vllm_jax.model.decoder import forward
from vllm_jax.model.mrope import mrope_positions
from vllm_jax.model.qwen2_5_vl import encode_images
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
from vllm_jax.worker.batch import RowChunk, pack_step_inputs

BLOCK, TOKENS, ROWS = 4, 128, 8
IMAGE = [VISION_START, IMAGE_PAD, VISION_END]
# 16-token budget: prefills split inside images
# one bucket (docs/contributing/testing.md, "Compile time"), TP 1 and TP 2 alike
ARGS = dict(max_model_len=96, num_gpu_blocks_override=32, block_size=8, max_num_seqs=4, max_num_batched_tokens=16,
            min_token_bucket=16, min_seq_bucket=4)
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_vl")
    return path, make_qwen3_vl_checkpoint(path, seed=5)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint[0]), **ARGS)


@pytest.fixture(scope="module")
def model(checkpoint):
    """(spec, params, the encoder, the forward), jitted, outside any engine."""
    source = resolve_model_source(str(checkpoint[0]))
    entry, spec = resolve_architecture(load_hf_config(source))
    graphdef, params = nnx.split(build_model(entry, spec, "float32", source))
    return spec, params, jax.jit(partial(encode_images, graphdef)), jax.jit(partial(forward, graphdef))


def _our_logits(model, ids: list[int], pixel_values, grids) -> tuple[np.ndarray, np.ndarray]:
    """Our logits at ROWS positions spread over the prompt (one prefill step through `forward`), and those
    positions."""
    spec, params, encode, step = model
    sizes = [int(np.prod(g)) for g in grids]
    embeds = []
    for pixels, grid, n in zip(np.split(pixel_values, np.cumsum(sizes)[:-1]), grids, sizes):
        batch = spec.vision.encoder_inputs(pixels, [grid], -(-n // 64) * 64)
        embeds.append(np.asarray(encode(params, batch))[:n // 4])
    n = len(ids)
    inputs = pack_step_inputs([RowChunk(ids, 0, list(range(1, 1 + -(-n // BLOCK))))], block_size=BLOCK,
                              max_blocks_per_seq=64, num_tokens_padded=TOKENS, num_seqs_padded=ROWS)
    inputs.mrope_positions = np.zeros((3, TOKENS), np.int32)
    inputs.mrope_positions[:, :n] = mrope_positions(ids, IMAGE_PAD, grids, 2)[0]
    inputs.mm_embeds = np.zeros((TOKENS, spec.mm_embed_width), np.float32)
    inputs.mm_mask = np.zeros(TOKENS, bool)
    rows = np.flatnonzero(np.array(ids) == IMAGE_PAD)
    inputs.mm_embeds[rows] = np.concatenate(embeds)
    inputs.mm_mask[rows] = True
    picked = np.linspace(0, n - 1, ROWS).astype(np.int32)
    inputs.logits_indices = picked
    kv = jnp.zeros((spec.num_cache_layers, 64, BLOCK, spec.kv_cache_heads, spec.kv_cache_width), jnp.float32)
    return np.asarray(step(params, kv, inputs)[1]), picked


def test_logits_match_transformers_one_and_two_images(checkpoint, model):
    hf = checkpoint[1]
    for sizes in ([(100, 80)], [(100, 80), (60, 150)]):  # grids 4x6 and 10x4 patches against an 8x8 table
        images = [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
        prompt = [1, 260, 261] + sum(([*IMAGE, 262 + i] for i in range(len(images))), []) + [264, 265, 266]
        processed = image_processor()(images=images, return_tensors="np")
        grids = [tuple(int(x) for x in g) for g in processed["image_grid_thw"]]
        ids = expand_placeholders(prompt, grids)
        ref = hf_logits(hf, ids, processed["pixel_values"], grids)
        ours, picked = _our_logits(model, ids, processed["pixel_values"], grids)
        assert np.abs(ref).max() > 0.1
        np.testing.assert_allclose(ours, ref[picked], atol=1e-4, rtol=0, err_msg=str(sizes))


def _hf_greedy(hf, tokenizer, prompt: str, images: list) -> list[int]:
    ids = tokenizer.encode(prompt)
    processed = image_processor()(images=images, return_tensors="pt")
    grids = [tuple(int(x) for x in g) for g in processed["image_grid_thw"]]
    t = torch.tensor([expand_placeholders(ids, grids)])
    with torch.no_grad():
        out = hf.generate(input_ids=t, attention_mask=torch.ones_like(t), pixel_values=processed["pixel_values"],
                          image_grid_thw=processed["image_grid_thw"], mm_token_type_ids=(t == IMAGE_PAD).int(),
                          max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, t.shape[1]:].tolist()


def test_greedy_equals_transformers_with_prefills_chunked_inside_images(checkpoint, llm):
    hf, engine = checkpoint[1], llm.llm_engine
    cases = [("ab" + PLACEHOLDER + "cd", [random_image(170, 150, 1)]),  # 25 image tokens: the budget splits them
             ("x" + PLACEHOLDER + "y" + PLACEHOLDER + "z", [random_image(100, 80, 2), random_image(60, 150, 3)])]
    compilations = engine.runner.num_compilations
    outs = llm.generate([{"prompt": p, "multi_modal_data": {"image": imgs}} for p, imgs in cases], GREEDY,
                        use_tqdm=False)
    assert engine.runner.num_compilations == compilations  # warm-up compiled the steps with their image arrays
    assert engine.runner.multimodal.encode._cache_size() == 0  # every image ran a warmed-up encoder executable
    for (prompt, images), out in zip(cases, outs):
        assert out.outputs[0].token_ids == _hf_greedy(hf, engine.tokenizer, prompt, images), prompt


def _run(engine, prompts: list[dict]) -> list:
    """Every prompt added at once; their final outputs in order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"q3-{id(prompts)}-{i}", prompt, GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        done.update((out.request_id, out) for out in engine.step() if out.finished)
    return [done[f"q3-{id(prompts)}-{i}"] for i in range(len(prompts))]


def test_prefix_cache_keys_include_the_image(llm):
    engine = llm.llm_engine
    text = "abcdefgh" * 2 + PLACEHOLDER + "tail"
    first, second = random_image(100, 80, 11), random_image(100, 80, 12)
    calls = engine.runner.multimodal.num_encoder_calls
    (a,) = _run(engine, [{"prompt": text, "multi_modal_data": {"image": first}}])
    (b,) = _run(engine, [{"prompt": text, "multi_modal_data": {"image": second}}])
    (c,) = _run(engine, [{"prompt": text, "multi_modal_data": {"image": first}}])
    assert a.outputs[0].token_ids != b.outputs[0].token_ids
    assert b.num_cached_tokens == 16  # the two text blocks before the image; nothing from the image's on
    assert c.num_cached_tokens > 16 and c.outputs[0].token_ids == a.outputs[0].token_ids
    assert engine.runner.multimodal.num_encoder_calls == calls + 2  # the third request encoded nothing


def test_chat_image_part_equals_the_rendered_prompt(llm):
    image = random_image(90, 70, 21)
    chat = llm.chat([{"role": "user", "content": [{"type": "image_pil", "image_pil": image},
                                                  {"type": "text", "text": "what?"}]}], GREEDY, use_tqdm=False)
    prompt = "<|im_start|>user\n" + PLACEHOLDER + "what?<|im_end|>\n<|im_start|>assistant\n"
    (plain,) = llm.generate([{"prompt": prompt, "multi_modal_data": {"image": image}}], GREEDY, use_tqdm=False)
    assert chat[0].outputs[0].token_ids == plain.outputs[0].token_ids
