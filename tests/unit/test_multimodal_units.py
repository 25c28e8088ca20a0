"""Host-side pieces of the vision-language path, without a model: the encoder cache's eviction, the encoder's patch
buckets and pixel cap, the window layout's segments, Qwen3-VL's interleaved M-RoPE streams and position-table taps
against transformers', and the capability query the server and LLM.chat use."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_jax.model.vision_layout import MAX_ENCODER_PATCHES, image_pixel_limits, vision_inputs
from vllm_jax.multimodal.capabilities import max_images_per_prompt, supports_images
from vllm_jax.multimodal.config import MultiModalConfig
from vllm_jax.multimodal.device.encoder_step import patch_buckets
from vllm_jax.multimodal.encoder_cache import EncoderCache, encoder_cache_tokens


def test_encoder_cache_keeps_what_running_requests_hold_and_evicts_the_oldest_free_entry():
    cache = EncoderCache(max_tokens=10)
    cache.put("a", "r1", np.zeros((6, 2)))
    cache.put("b", "r2", np.zeros((6, 2)))  # over budget, but both are held
    assert set(cache.entries) == {"a", "b"}
    cache.release("r1")  # "a" is free and the cache is over its budget: evicted
    assert set(cache.entries) == {"b"}
    assert cache.get("b", "r3") is not None and cache.get("a", "r3") is None
    cache.release("r2")  # "b" is still held by r3, and within budget anyway
    assert set(cache.entries) == {"b"}


def test_encoder_cache_size_flag_defaults_to_vllms_size_and_refuses_less_than_one_image():
    assert encoder_cache_tokens(0, max_num_batched_tokens=256, largest_image_tokens=100) == 256  # vLLM's size
    assert encoder_cache_tokens(0, max_num_batched_tokens=32, largest_image_tokens=100) == 100
    assert encoder_cache_tokens(4096, max_num_batched_tokens=32, largest_image_tokens=100) == 4096
    with pytest.raises(ValueError, match="encoder_cache_size 50 is smaller than one image.*100 image tokens"):
        encoder_cache_tokens(50, max_num_batched_tokens=256, largest_image_tokens=100)
    assert MultiModalConfig.create(encoder_cache_size=512).encoder_cache_size == 512
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="encoder_cache_size must be a non-negative"):
            MultiModalConfig.create(encoder_cache_size=bad)


def test_patch_buckets_and_the_pixel_cap(tmp_path):
    assert patch_buckets(160, 4) == [64, 128, 256]
    assert patch_buckets(10, 4) == [64]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 100, "max_pixels": 10 ** 9}))
    assert image_pixel_limits(str(tmp_path), 14) == (100, MAX_ENCODER_PATCHES * 14 * 14)
    assert image_pixel_limits(str(tmp_path / "missing"), 14)[0] == 3136  # Qwen's defaults without a config


def test_window_layout_segments():
    # one 8x8-patch image, merge 2, windows of 4x4 patches: four windows of 16 patches, padded to 80 patches
    layout = vision_inputs(np.arange(64, dtype=np.float32)[:, None], [(1, 8, 8)], 2, 4, 80)
    assert np.bincount(layout.window_segment[:64]).tolist() == [16, 16, 16, 16]
    assert (layout.window_segment[64:] == -1).all() and (layout.image_segment[:64] == 0).all()
    # the merged output goes back to the processor's order: a permutation of the 16 real tokens
    assert sorted(layout.merged_order[:16].tolist()) == list(range(16))


def test_capabilities():
    vl = SimpleNamespace(architectures=["Qwen2_5_VLForConditionalGeneration"])
    text = SimpleNamespace(architectures=["Qwen2ForCausalLM"])
    assert supports_images(vl) and max_images_per_prompt(vl) is None
    assert not supports_images(text) and max_images_per_prompt(text) == 0


def test_interleaved_mrope_streams_and_position_taps_match_transformers():
    import torch
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    from vllm_jax.model.mrope import mrope_streams
    from vllm_jax.model.qwen3_vision_layout import qwen3_vision_inputs

    sections = (24, 20, 20)  # the released checkpoints': each frequency tagged with its stream, recomposed by HF
    freq = torch.arange(3.0)[:, None, None, None].expand(3, 1, 1, sum(sections)).clone()
    rotary = SimpleNamespace(mrope_section=list(sections))
    ref = Qwen3VLTextRotaryEmbedding.recomposition_frequencies(rotary, freq)[0, 0, :sum(sections)]
    np.testing.assert_array_equal(mrope_streams(sections, interleaved=True), ref.numpy())
    grids = [(1, 6, 10), (1, 4, 4)]
    layout = qwen3_vision_inputs(np.zeros((76, 3), np.float32), grids, 2, 2304, 128)
    index, weight = get_vision_interpolation_indices_and_weights(torch.tensor(grids), 48, align_corners=True,
                                                                 spatial_merge_size=2)
    np.testing.assert_array_equal(layout.pos_index[:76], index.numpy())
    np.testing.assert_array_equal(layout.pos_weight[:76], weight.numpy())
    assert (layout.pos_weight[76:] == 0).all() and (layout.image_segment[76:] == -1).all()
