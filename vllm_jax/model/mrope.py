"""M-RoPE (Qwen2-VL / Qwen2.5-VL / Qwen3-VL): three position streams (t, h, w) rotate disjoint sections of the rotary
frequencies (docs/architecture/15-multimodal.md, "M-RoPE"). Text tokens carry one position in all three streams,
which gives exactly the 1-D rope; an image's tokens carry (t, row, column) offsets from where the image starts.

`mrope_positions` is the host side (numpy, HF's get_rope_index for images); `mrope_tables` the device side."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def mrope_streams(sections: tuple[int, ...], interleaved: bool = False) -> np.ndarray:
    """The stream (0 t, 1 h, 2 w) each rotary frequency reads. Sectioned (Qwen2-VL, Qwen2.5-VL): frequency j
    reads (its section's index) % 3. Interleaved (Qwen3-VL): t h w t h w ..., frequency j reads j % 3 while that
    stream's section lasts (j < 3 * section), t after."""
    if not interleaved:
        return np.repeat(np.arange(len(sections)) % 3, sections)
    j = np.arange(sum(sections))
    stream = np.zeros(len(j), np.int64)
    for s in (1, 2):
        stream[(j % 3 == s) & (j < 3 * sections[s])] = s
    return stream


def mrope_tables(inv_freq: tuple[float, ...], sections: tuple[int, ...], scaling: float,
                 positions: jax.Array, interleaved: bool = False) -> tuple[jax.Array, jax.Array]:
    """cos and sin [T, head_dim] for `positions` [3, T], each frequency rotated by its stream (mrope_streams)."""
    stream = mrope_streams(sections, interleaved)
    inv = jnp.asarray(np.array(inv_freq, dtype=np.float32))
    freqs = positions.astype(jnp.float32)[stream, :].T * inv[None, :]  # [T, head_dim / 2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scaling, jnp.sin(emb) * scaling


def mrope_positions(token_ids: np.ndarray | list[int], image_token_id: int, grids: list[tuple[int, int, int]],
                    spatial_merge_size: int) -> tuple[np.ndarray, int]:
    """([3, N] int32 positions of a prompt, delta): each run of `image_token_id` is the next image of `grids`
    ((t, h, w) in patches); text advances by one, an image by max(h, w) / merge. `delta` (max position + 1 - N)
    is what decode adds to a token's index to get its position in all three streams."""
    ids = np.asarray(token_ids)
    n = len(ids)
    out = np.zeros((3, n), np.int64)
    is_image = ids == image_token_id
    pos, i, image = 0, 0, 0
    while i < n:
        j = i
        while j < n and is_image[j] == is_image[i]:
            j += 1
        if not is_image[i]:
            out[:, i:j] = np.arange(pos, pos + j - i)
            pos += j - i
        else:
            if image >= len(grids):
                raise ValueError(f"the prompt has more image placeholder runs than images ({len(grids)})")
            t, h, w = (int(x) for x in grids[image])
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            if j - i != t * gh * gw:
                raise ValueError(f"image {image}: {j - i} placeholder tokens, its grid needs {t * gh * gw}")
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
            out[:, i:j] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + pos
            pos += max(gh, gw)
            image += 1
        i = j
    if image != len(grids):
        raise ValueError(f"{len(grids)} images but {image} image placeholder runs in the prompt")
    delta = int(out.max()) + 1 - n if n else 0
    return out.astype(np.int32), delta
