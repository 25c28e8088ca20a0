"""Host-side layout of Qwen2.5-VL's vision encoder inputs (numpy): the window order of the patches, each patch's
(row, column) for the 2D rope, the attention segments (window / whole image), padded to a patch bucket
(docs/architecture/15-multimodal.md, "The vision encoder")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

# The most patches the encoder takes per image: its dense attention holds [heads, P, P] scores per block (4096
# patches: 1 GiB of float32 scores at 16 heads), so larger images are resized down to this many by the processor.
MAX_ENCODER_PATCHES = 4096
QWEN_DEFAULT_PIXELS = (3136, 12845056)  # Qwen2-VL's processor's min_pixels / max_pixels


@jax.tree_util.register_dataclass
@dataclass
class VisionInputs:
    """One encoder call over P padded patches (P a multiple of the merge unit) making M = P / merge_unit tokens."""

    pixels: np.ndarray  # [P, patch_dim] the processor's pixel_values rows, in window order
    positions: np.ndarray  # [P, 2] int32 (row, column) of each patch, in window order
    window_segment: np.ndarray  # [P] int32 window id (window-attention layers attend within one)
    image_segment: np.ndarray  # [P] int32 image id (full-attention layers attend within one)
    merged_order: np.ndarray  # [M] int32 the merged token (window order) of each output row (processor order)


def vision_inputs(pixels: np.ndarray, grids: list[tuple[int, int, int]], merge: int, window_patches: int,
                  num_patches_padded: int) -> VisionInputs:
    """The layout of `pixels` [sum t*h*w, patch_dim] for images of `grids` (t, h, w in patches), padded to
    `num_patches_padded` rows. `window_patches`: window_size // patch_size, a window's side in patches. Padding
    patches form their own segment (no real patch attends to them) and their outputs are never read."""
    unit = merge * merge
    merger_window = window_patches // merge  # a window's side in merged tokens
    order, window_of, image_of, positions = [], [], [], []
    first_token, num_windows = 0, 0
    for image, (t, h, w) in enumerate(grids):
        gh, gw = h // merge, w // merge
        tokens = np.arange(t * gh * gw).reshape(t, gh, gw)
        pad_h, pad_w = -gh % merger_window, -gw % merger_window
        padded = np.pad(tokens, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-1)
        nh, nw = (gh + pad_h) // merger_window, (gw + pad_w) // merger_window
        windows = padded.reshape(t, nh, merger_window, nw, merger_window).transpose(0, 1, 3, 2, 4)
        windows = windows.reshape(t * nh * nw, -1)
        for window in windows:
            kept = window[window >= 0]
            order.append(kept + first_token)
            window_of.append(np.full(len(kept) * unit, num_windows))
            num_windows += 1
        image_of.append(np.full(t * h * w, image))
        positions.append(np.tile(patch_rows_cols(h, w, merge), (t, 1)))
        first_token += t * gh * gw
    token_order = np.concatenate(order)
    patch_order = (token_order[:, None] * unit + np.arange(unit)).ravel()
    total = len(patch_order)
    if total > num_patches_padded:
        raise ValueError(f"{total} patches exceed the encoder bucket of {num_patches_padded}")
    pad = num_patches_padded - total
    out_pixels = np.zeros((num_patches_padded, pixels.shape[1]), pixels.dtype)
    out_pixels[:total] = pixels[patch_order]
    out_positions = np.zeros((num_patches_padded, 2), np.int32)
    out_positions[:total] = np.concatenate(positions)[patch_order]
    merged_order = np.zeros(num_patches_padded // unit, np.int32)
    merged_order[:len(token_order)] = np.argsort(token_order)
    return VisionInputs(
        pixels=out_pixels, positions=out_positions,
        window_segment=np.concatenate([np.concatenate(window_of), np.full(pad, -1)]).astype(np.int32),
        image_segment=np.concatenate([np.concatenate(image_of)[patch_order], np.full(pad, -1)]).astype(np.int32),
        merged_order=merged_order)


def patch_rows_cols(h: int, w: int, merge: int) -> np.ndarray:
    """[h * w, 2] (row, column) of each patch of one frame in the processor's order: merge blocks, each block
    row-major (HF's get_vision_position_ids)."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    block = (h // merge, merge, w // merge, merge)
    return np.stack([rows.reshape(block).transpose(0, 2, 1, 3).ravel(),
                     cols.reshape(block).transpose(0, 2, 1, 3).ravel()], axis=-1)


def image_pixel_limits(model_path: str, patch_size: int) -> tuple[int, int]:
    """(min_pixels, max_pixels) images are resized into: the checkpoint's preprocessor_config.json (`min_pixels` /
    `max_pixels`, or `size.shortest_edge` / `longest_edge`), max_pixels capped at MAX_ENCODER_PATCHES patches."""
    path = Path(model_path) / "preprocessor_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    size = config.get("size") or {}
    low = int(config.get("min_pixels") or size.get("shortest_edge") or QWEN_DEFAULT_PIXELS[0])
    high = int(config.get("max_pixels") or size.get("longest_edge") or QWEN_DEFAULT_PIXELS[1])
    return low, min(high, MAX_ENCODER_PATCHES * patch_size ** 2)
