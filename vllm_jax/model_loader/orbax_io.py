"""Converted checkpoints: params saved with orbax after loading/conversion, restored straight into any mesh.

`vllm-jax convert MODEL OUT_DIR` writes OUT_DIR/config.json, the tokenizer files and OUT_DIR/params (an orbax
checkpoint of the model's params in the chosen dtype). Loading OUT_DIR restores each param directly onto its
`NamedSharding` (orbax reads each device's shard), skipping the HF -> stacked-layout conversion and GGUF
dequantization: the fast path for restarts. A directory converted with fused q/k/v restores into a mesh whose tp
keeps them separate, and the other way round (model/fused_projections.py): those params are restored on the host
and split or joined there, then placed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.model.fused_projections import QKV, QKV_PARTS, qkv_layout
from vllm_jax.model_loader.errors import ModelSourceError
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
        shapes = _stored_shapes(self.directory) or request.shapes
        host = _host_sharding()
        abstract = {path: jax.ShapeDtypeStruct(shape, jnp.dtype(NP_DTYPES[stored]), sharding=(
            request.sharding_for(path, shape) if path in request.shapes else host)) for path, shape in shapes.items()}
        try:
            restored = restore_params(self.directory, unflatten_params(abstract))
        except Exception as exc:
            raise ModelSourceError(f"{self.directory / PARAMS_DIR}: cannot restore the converted params ({exc}); "
                                   "convert the model again with `vllm-jax convert`") from exc
        params = _relayout(flatten_params(restored), request)
        if set(params) != set(request.shapes):
            raise ModelSourceError(f"{self.directory / PARAMS_DIR}: the converted params do not match the model "
                                   f"(missing {sorted(set(request.shapes) - set(params))[:3]}, unexpected "
                                   f"{sorted(set(params) - set(request.shapes))[:3]}); convert it again")
        if stored != request.dtype:
            params = {path: value.astype(NP_DTYPES[request.dtype]) for path, value in params.items()}
        return params


def _stored_shapes(directory: Path) -> dict[ParamPath, tuple[int, ...]] | None:
    """Each stored param's shape, from the checkpoint's metadata (None when it cannot be read)."""
    import orbax.checkpoint as ocp

    try:
        metadata = ocp.StandardCheckpointer().metadata(Path(directory).resolve() / PARAMS_DIR)
    except (OSError, ValueError, KeyError, TypeError):  # damaged or older: the restore below names the fault
        return None
    tree = getattr(metadata, "item_metadata", metadata)
    return {path: tuple(leaf.shape) for path, leaf in flatten_params(dict(tree)).items()}


def _host_sharding() -> jax.sharding.Sharding:
    """Where a param that changes layout is restored before it is split or joined: the host's CPU device."""
    try:
        return jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    except RuntimeError:  # no CPU backend in this process (JAX_PLATFORMS without cpu)
        return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _relayout(params: dict[ParamPath, jax.Array], request: LoadRequest) -> dict[ParamPath, jax.Array]:
    """Fused q/k/v split into the parts the model wants, or the parts joined into its fused param."""
    out = dict(params)
    fused, parts = ("layers", QKV), [("layers", part) for part in QKV_PARTS]
    if fused in out and fused not in request.shapes and all(p in request.shapes for p in parts):
        for path, part in zip(parts, qkv_layout(request.spec).split(np.asarray(out.pop(fused)))):
            out[path] = jax.device_put(part, request.sharding_for(path, part.shape))
    elif fused in request.shapes and all(p in out and p not in request.shapes for p in parts):
        joined = qkv_layout(request.spec).join([np.asarray(out.pop(p)) for p in parts])
        out[fused] = jax.device_put(joined, request.sharding_for(fused, joined.shape))
    return out
