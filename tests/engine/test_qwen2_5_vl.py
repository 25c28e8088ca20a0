"""Qwen2.5-VL against transformers (PyTorch CPU, float32) on a tiny random checkpoint: the vision tower's tokens
and the decoder's logits at every prompt position within 1e-4, for one image, two images of different sizes and
text only; the M-RoPE positions of HF's get_rope_index."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.vl_models import (
    IMAGE_PAD,
    VISION_END,
    VISION_START,
    expand_placeholders,
    hf_logits,
    image_processor,
    make_vl_checkpoint,
    random_image,
)
from vllm_jax.model.decoder import forward
from vllm_jax.model.mrope import mrope_positions
from vllm_jax.model.qwen2_5_vl import encode_images
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model.vision_layout import vision_inputs
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
from vllm_jax.worker.batch import RowChunk, pack_step_inputs

BLOCK, TOKENS, ROWS = 4, 128, 8
IMAGE = [VISION_START, IMAGE_PAD, VISION_END]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    hf = make_vl_checkpoint(path, seed=5)
    source = resolve_model_source(str(path))
    entry, spec = resolve_architecture(load_hf_config(source))
    graphdef, params = nnx.split(build_model(entry, spec, "float32", source))
    return hf, spec, params, jax.jit(partial(encode_images, graphdef)), jax.jit(partial(forward, graphdef))


def _our_logits(models, ids: list[int], pixel_values, grids) -> np.ndarray:
    """Our logits at ROWS positions spread over the prompt (one prefill step), and those positions."""
    _, spec, params, encode, step = models
    embeds = []
    sizes = [int(np.prod(g)) for g in grids]
    for pixels, grid, n in zip(np.split(pixel_values, np.cumsum(sizes)[:-1]) if grids else [], grids, sizes):
        batch = vision_inputs(pixels, [grid], 2, spec.vision.window_size // spec.vision.patch_size, -(-n // 64) * 64)
        embeds.append(np.asarray(encode(params, batch))[:n // 4])
    n = len(ids)
    inputs = pack_step_inputs([RowChunk(ids, 0, list(range(1, 1 + -(-n // BLOCK))))], block_size=BLOCK,
                              max_blocks_per_seq=64, num_tokens_padded=TOKENS, num_seqs_padded=ROWS)
    inputs.mrope_positions = np.zeros((3, TOKENS), np.int32)
    inputs.mrope_positions[:, :n] = mrope_positions(ids, IMAGE_PAD, grids, 2)[0]
    inputs.mm_embeds = np.zeros((TOKENS, spec.hidden_size), np.float32)
    inputs.mm_mask = np.zeros(TOKENS, bool)
    rows = np.flatnonzero(np.array(ids) == IMAGE_PAD)
    if len(rows):
        inputs.mm_embeds[rows] = np.concatenate(embeds)
        inputs.mm_mask[rows] = True
    # real logits rows point at increasing tokens and the padding's at 0, as the engine packs them (the CPU's native
    # head computes only the real ones: step_inputs.real_logits_rows)
    picked = np.unique(np.linspace(0, n - 1, ROWS).astype(np.int32))
    inputs.logits_indices = np.pad(picked, (0, ROWS - len(picked)))
    kv = jnp.zeros((spec.num_cache_layers, 64, BLOCK, spec.kv_cache_heads, spec.kv_cache_width), jnp.float32)
    return np.asarray(step(params, kv, inputs)[1])[:len(picked)], picked


@pytest.mark.parametrize("sizes", [[(100, 80)], [(100, 80), (60, 150)], []],
                         ids=["one_image", "two_images", "text_only"])
def test_logits_match_transformers(models, sizes):
    hf = models[0]
    images = [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    prompt = [1, 260, 261] + sum(([*IMAGE, 262 + i] for i in range(len(images))), []) + [264, 265, 266, 267]
    pixel_values, grids = None, []
    if images:
        processed = image_processor()(images=images, return_tensors="np")
        pixel_values = processed["pixel_values"]
        grids = [tuple(int(x) for x in g) for g in processed["image_grid_thw"]]
    ids = expand_placeholders(prompt, grids)
    ref = hf_logits(hf, ids, pixel_values, grids)
    ours, picked = _our_logits(models, ids, pixel_values, grids)
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(ours, ref[picked], atol=1e-4, rtol=0)


def test_mrope_positions_match_get_rope_index(models):
    import torch

    hf = models[0]
    grids = [(1, 6, 8), (1, 10, 4)]
    ids = expand_placeholders([1, 260, *IMAGE, 262, *IMAGE, 263], grids)
    ours, delta = mrope_positions(ids, IMAGE_PAD, grids, 2)
    t = torch.tensor([ids])
    ref, ref_delta = hf.model.get_rope_index(t, mm_token_type_ids=(t == IMAGE_PAD).int(),
                                             image_grid_thw=torch.tensor(grids))
    np.testing.assert_array_equal(ours, ref[:, 0].numpy())
    assert delta == int(ref_delta[0, 0])
    with pytest.raises(ValueError, match="2 images but 1 image placeholder runs"):
        mrope_positions(expand_placeholders([1, *IMAGE], grids[:1]), IMAGE_PAD, grids, 2)
