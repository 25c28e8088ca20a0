"""A tiny random Qwen3-VL checkpoint (3 decoder layers of width 64, a 3-block vision tower of width 32 with two
DeepStack taps and an 8x8 learned position table), its PIL image processor (16-pixel patches) and the byte
tokenizer with the vision special tokens (tests/engine/test_qwen3_vl.py). Images, placeholder expansion and
transformers' logits: tests/helpers/vl_models.py's, which fit both families."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from tests.helpers.tiny_models import EOS_ID, VOCAB_SIZE
from tests.helpers.vl_models import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, save_vl_tokenizer

PATCH, MERGE = 16, 2
MIN_PIXELS, MAX_PIXELS = 64 * 64, 32 * 32 * 40  # images of 4 .. 40 merged tokens


def make_qwen3_vl_checkpoint(path: Path, seed: int = 0,
                             max_pixels: int = MAX_PIXELS) -> Qwen3VLForConditionalGeneration:
    """Save the tiny model (safetensors), tokenizer and preprocessor_config.json (images resized into MIN_PIXELS ..
    `max_pixels`) to `path`; returns the torch model (float32, eval)."""
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=EOS_ID,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2,
                           num_position_embeddings=64, deepstack_visual_indexes=[0, 2]),
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=0)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger weights, non-unit norms and biases: a wrong detail shows in the logits
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            elif "visual" in name:
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    save_vl_tokenizer(path)
    image_processor(max_pixels).save_pretrained(path)
    return model


def image_processor(max_pixels: int = MAX_PIXELS) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, min_pixels=MIN_PIXELS,
                                    max_pixels=max_pixels, image_mean=[0.5] * 3, image_std=[0.5] * 3)
