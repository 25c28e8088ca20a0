"""A tiny random Qwen2.5-VL checkpoint (2 decoder layers of width 64, a 2-block vision tower with one window and
one full-attention block), its PIL image processor and the byte tokenizer with the vision special tokens; random
images; transformers' forward on the same pixel values (tests/test_qwen2_5_vl*.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from tests.helpers.tiny_models import EOS_ID, VOCAB_SIZE, byte_tokenizer

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = range(285, 289)  # appended after the byte tokenizer's 285
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen2.5-VL's chat format, cut down: each image part (Qwen's "image" / "image_url" / vLLM's "image_pil") renders
# the placeholder, text parts their text (the byte tokenizer spells <|im_start|> out in bytes)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] in ('image', 'image_url', 'image_pil') %}" + PLACEHOLDER + "{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 40  # images of 4 .. 40 merged tokens


def make_vl_checkpoint(path: Path, seed: int = 0, max_pixels: int = MAX_PIXELS) -> Qwen2_5_VLForConditionalGeneration:
    """Save the tiny model (safetensors), tokenizer and preprocessor_config.json (images resized into MIN_PIXELS ..
    `max_pixels`) to `path`; returns the torch model (float32, eval)."""
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=EOS_ID,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                           fullatt_block_indexes=[1]),
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=0)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger weights and non-unit norms: a wrong detail shows in the logits
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "ln_q" in name or "norm1" in name or "norm2" in name:
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            elif "visual" in name:
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    save_vl_tokenizer(path)
    image_processor(max_pixels).save_pretrained(path)
    return model


def save_vl_tokenizer(path: Path) -> None:
    """The byte tokenizer with the Qwen vision special tokens and the cut-down chat template (Qwen2.5-VL's and
    Qwen3-VL's share them)."""
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    assert tokenizer.convert_tokens_to_ids(list(VISION_TOKENS)) == [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)


def image_processor(max_pixels: int = MAX_PIXELS) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=max_pixels)


def random_image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def expand_placeholders(token_ids: list[int], grids: list[tuple[int, int, int]]) -> list[int]:
    """Each single image pad replaced by its image's merged-token count (what the processor does for HF)."""
    out, images = [], iter(grids)
    for token in token_ids:
        if token == IMAGE_PAD:
            t, h, w = next(images)
            out += [IMAGE_PAD] * (t * h * w // 4)
        else:
            out.append(token)
    return out


def hf_logits(model, token_ids: list[int], pixel_values: np.ndarray | None,
              grids: list[tuple[int, int, int]]) -> np.ndarray:
    """transformers' logits [N, vocab] for the expanded prompt and the processor's pixel values."""
    ids = torch.tensor([token_ids])
    kwargs = {}
    if pixel_values is not None:
        kwargs = dict(pixel_values=torch.from_numpy(pixel_values), image_grid_thw=torch.tensor(grids),
                      mm_token_type_ids=(ids == IMAGE_PAD).int())
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits[0].numpy()
