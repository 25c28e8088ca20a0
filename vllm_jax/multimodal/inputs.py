"""A request's images made into what the engine needs (docs/architecture/15-multimodal.md, "A request's images"):
the HF image processor's pixel values and grids, each image's content hash, the prompt with each single image
placeholder expanded to the image's token count, and its M-RoPE positions. Host-side, at add_request."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_jax.model.mrope import mrope_positions
from vllm_jax.models.qwen2_5_vl.spec import Qwen2_5_VLSpec
from vllm_jax.models.qwen2_5_vl.vision_layout import image_pixel_limits


@dataclass(frozen=True)
class ImageItem:
    """One image of a prompt: its patch rows [t*h*w, patch_dim], its grid (t, h, w) in patches, its content hash,
    and where its placeholder tokens lie in the prompt (offset, length)."""

    pixel_values: np.ndarray
    grid: tuple[int, int, int]
    hash: str
    offset: int
    length: int


@dataclass(frozen=True)
class MultiModalInputs:
    """A request's images and its prompt's M-RoPE positions [3, N] (int32) and delta (decode: index + delta)."""

    images: tuple[ImageItem, ...]
    mrope_positions: np.ndarray
    mrope_delta: int


def image_hash(image: Any) -> str:
    """The image's content hash (mode, size and pixels): equal images share encoder outputs and KV blocks."""
    h = hashlib.sha256(f"{image.mode}:{image.size}".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def load_image_processor(model_path: str, spec: Qwen2_5_VLSpec) -> Any:
    """The checkpoint's image processor on the PIL backend (the default torchvision one would make torchvision a
    dependency), resizing into its min_pixels / max_pixels with max_pixels capped where the encoder's buckets
    end (models/qwen2_5_vl/vision_layout.py image_pixel_limits)."""
    from transformers import AutoImageProcessor

    low, high = image_pixel_limits(model_path, spec.vision.patch_size)
    return AutoImageProcessor.from_pretrained(model_path, backend="pil", trust_remote_code=False,
                                              size={"shortest_edge": low, "longest_edge": high})


def process_images(token_ids: list[int], images: list[Any], spec: Qwen2_5_VLSpec,
                   processor: Any) -> tuple[list[int], MultiModalInputs]:
    """-> (the prompt with each single image placeholder expanded, the request's MultiModalInputs). The prompt
    must hold exactly one placeholder per image, in order (a ValueError names the counts otherwise)."""
    pad = spec.image_token_id
    found = sum(1 for t in token_ids if t == pad)
    if found != len(images):
        raise ValueError(f"the prompt has {found} image placeholder(s) (<|image_pad|>, id {pad}) but "
                         f"{len(images)} image(s) were given in multi_modal_data")
    for i, image in enumerate(images):
        if not hasattr(image, "tobytes") or not hasattr(image, "mode"):
            raise ValueError(f"multi_modal_data image {i}: expected a PIL.Image, got {type(image).__name__}")
    if not images:
        return token_ids, MultiModalInputs((), np.zeros((3, 0), np.int32), 0)
    out = processor(images=[image.convert("RGB") for image in images], return_tensors="np")
    grids = [tuple(int(x) for x in g) for g in out["image_grid_thw"]]
    merge = spec.vision.merge_unit
    sizes = [t * h * w for t, h, w in grids]
    pixels = np.split(np.asarray(out["pixel_values"], np.float32), np.cumsum(sizes)[:-1])
    expanded: list[int] = []
    items = []
    image = 0
    for token in token_ids:
        if token != pad:
            expanded.append(token)
            continue
        length = sizes[image] // merge
        items.append(ImageItem(pixels[image], grids[image], image_hash(images[image]), len(expanded), length))
        expanded += [pad] * length
        image += 1
    positions, delta = mrope_positions(expanded, pad, grids, spec.vision.spatial_merge_size)
    return expanded, MultiModalInputs(tuple(items), positions, delta)
