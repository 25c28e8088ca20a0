"""Converted checkpoints: params saved with orbax after loading/conversion, restored straight into any mesh.

`vllm-jax convert MODEL OUT_DIR` writes OUT_DIR/config.json, the tokenizer files and OUT_DIR/params (an orbax
checkpoint of the model's params in the chosen dtype). Loading OUT_DIR restores each param directly onto its
`NamedSharding` (orbax reads each device's shard), skipping the HF -> stacked-layout conversion and GGUF
dequantization: the fast path for restarts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax

PARAMS_DIR = "params"
MARKER = "vllm_jax_checkpoint.json"


def is_converted_checkpoint(directory: Path) -> bool:
    return (directory / MARKER).is_file() and (directory / PARAMS_DIR).is_dir()


def save_converted(out_dir: str | Path, params: dict, hf_config: Any, tokenizer: Any, dtype: str) -> Path:
    """Write a converted checkpoint; `params` is the model's pure param dict (arrays, any sharding)."""
    import orbax.checkpoint as ocp

    out = Path(out_dir).resolve()
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: output directory exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(out / PARAMS_DIR, params)
    checkpointer.wait_until_finished()
    (out / MARKER).write_text(json.dumps({"format": 1, "dtype": dtype}))
    return out


def converted_dtype(directory: Path) -> str:
    return json.loads((directory / MARKER).read_text())["dtype"]


def restore_params(directory: Path, abstract: dict) -> dict:
    """Restore onto the shardings of `abstract` (a tree of jax.ShapeDtypeStruct with `sharding` set)."""
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer().restore(Path(directory).resolve() / PARAMS_DIR, abstract)


def abstract_like(shapes: dict, sharding_for, dtype) -> dict:
    """ShapeDtypeStructs with the target dtype and sharding for every leaf of a pure shape dict."""
    def leaf(path, value):
        keys = tuple(getattr(k, "key", getattr(k, "name", k)) for k in path)
        return jax.ShapeDtypeStruct(value.shape, dtype, sharding=sharding_for(keys, tuple(value.shape)))

    return jax.tree_util.tree_map_with_path(leaf, shapes)
