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
import jax.numpy as jnp

from vllm_jax.model_loader.source import ModelSourceError
from vllm_jax.model_loader.weight_loader import NP_DTYPES, LoadRequest, ParamPath, flatten_params, unflatten_params

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


class ConvertedLoader:
    """Params from a `vllm-jax convert` directory, each restored onto its sharding, cast if --dtype differs."""

    def __init__(self, directory: Path):
        self.directory = directory

    def load(self, request: LoadRequest) -> dict[ParamPath, jax.Array]:
        stored = converted_dtype(self.directory)
        abstract = {path: jax.ShapeDtypeStruct(shape, jnp.dtype(NP_DTYPES[stored]),
                                               sharding=request.sharding_for(path, shape))
                    for path, shape in request.shapes.items()}
        try:
            restored = restore_params(self.directory, unflatten_params(abstract))
        except Exception as exc:
            raise ModelSourceError(f"{self.directory / PARAMS_DIR}: cannot restore the converted params ({exc}); "
                                   "convert the model again with `vllm-jax convert`") from exc
        params = flatten_params(restored)
        if stored != request.dtype:
            params = {path: value.astype(NP_DTYPES[request.dtype]) for path, value in params.items()}
        return params
