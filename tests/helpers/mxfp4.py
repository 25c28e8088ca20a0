"""gpt-oss checkpoints with MXFP4 experts in the published layout, made from a float tiny checkpoint by our own
encoder (tests/engine/test_gpt_oss_mxfp4.py, the MXFP4 sharding check)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
EXPERTS = ("gate_up_proj", "down_proj")


def encode_mxfp4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float expert weight [E, in, out] -> (blocks uint8 [E, out, in / 32, 16], scales uint8 [E, out, in / 32]):
    per 32 inputs the smallest power of two putting the largest |w| within e2m1's 6, then the nearest code
    (element 2k in the low nibble)."""
    rows = weight.swapaxes(1, 2)  # [E, out, in]
    groups = rows.reshape(*rows.shape[:-1], -1, 32)
    amax = np.abs(groups).max(axis=-1)
    exponent = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), -127).astype(np.int32)
    scaled = groups / np.exp2(exponent)[..., None]
    codes = np.abs(scaled[..., None] - E2M1).argmin(axis=-1).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    # contiguous: safetensors.numpy writes a strided array's buffer in memory order
    return np.ascontiguousarray(blocks), np.ascontiguousarray((exponent + 127).astype(np.uint8))


def make_mxfp4_checkpoint(float_dir: Path, out_dir: Path) -> Path:
    """`float_dir` (a gpt-oss save_pretrained directory) with its experts in MXFP4 and quant_method mxfp4."""
    packed = {}
    for name, value in load_file(str(float_dir / "model.safetensors")).items():
        if name.endswith(EXPERTS):
            packed[name + "_blocks"], packed[name + "_scales"] = encode_mxfp4(value)
        else:
            packed[name] = value
    shutil.copytree(float_dir, out_dir)
    save_file(packed, str(out_dir / "model.safetensors"))
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out_dir / "config.json").write_text(json.dumps(config))
    return out_dir
