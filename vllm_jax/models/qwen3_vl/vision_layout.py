"""Host-side layout of Qwen3-VL's vision encoder inputs (numpy): each patch's (row, column) for the 2D rope, its
image (attention segment) and the bilinear taps that resample the learned square position table to the image's
grid, padded to a patch bucket (docs/architecture/15-multimodal.md, "Qwen3-VL"). No windows: the patches stay in
the processor's order, so the merged tokens come out in the prompt's order."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from vllm_jax.models.qwen2_5_vl.vision_layout import patch_rows_cols


@jax.tree_util.register_dataclass
@dataclass
class Qwen3VisionInputs:
    """One encoder call over P padded patches (P a multiple of the merge unit)."""

    pixels: np.ndarray  # [P, patch_dim] the processor's pixel_values rows
    positions: np.ndarray  # [P, 2] int32 (row, column) of each patch
    image_segment: np.ndarray  # [P] int32 image id (attention stays within one image; padding is -1)
    pos_index: np.ndarray  # [P, 4] int32 rows of the learned position table to mix (bilinear taps)
    pos_weight: np.ndarray  # [P, 4] float32 their weights (0 for padding)


def bilinear_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """(taps [N, 2] int32, weights [N, 2] float32) resampling a `side`-long axis to `size` points with
    align_corners=True, at the points `index` (F.interpolate's bilinear, as transformers' vision_utils computes
    it in float32)."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2, dtype=np.float32)
    taps = np.clip(floor[:, None] + offsets, 0, side - 1).astype(np.int32)
    weights = np.maximum(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets), np.float32(0))
    return taps, weights.astype(np.float32)


def qwen3_vision_inputs(pixels: np.ndarray, grids: list[tuple[int, int, int]], merge: int, num_positions: int,
                        num_patches_padded: int) -> Qwen3VisionInputs:
    """The layout of `pixels` [sum t*h*w, patch_dim] for images of `grids` (t, h, w in patches), padded to
    `num_patches_padded` rows; `num_positions`: the learned table's rows (a square of side sqrt of it)."""
    side = int(num_positions ** 0.5)
    positions, segments, index, weight = [], [], [], []
    for image, (t, h, w) in enumerate(grids):
        rc = np.tile(patch_rows_cols(h, w, merge), (t, 1))
        h_taps, h_weights = bilinear_taps(rc[:, 0], h, side)
        w_taps, w_weights = bilinear_taps(rc[:, 1], w, side)
        index.append((h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4))
        weight.append((h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4))
        positions.append(rc)
        segments.append(np.full(len(rc), image))
    total = sum(len(p) for p in positions)
    if total > num_patches_padded:
        raise ValueError(f"{total} patches exceed the encoder bucket of {num_patches_padded}")
    pad = num_patches_padded - total

    def padded(parts: list[np.ndarray], dtype, fill=0) -> np.ndarray:
        body = np.concatenate(parts).astype(dtype)
        return np.concatenate([body, np.full((pad, *body.shape[1:]), fill, dtype)])

    out_pixels = np.zeros((num_patches_padded, pixels.shape[1]), pixels.dtype)
    out_pixels[:total] = pixels[:total]
    return Qwen3VisionInputs(pixels=out_pixels, positions=padded(positions, np.int32),
                             image_segment=padded(segments, np.int32, -1), pos_index=padded(index, np.int32),
                             pos_weight=padded(weight, np.float32))
