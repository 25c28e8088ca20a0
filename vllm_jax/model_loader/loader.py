"""Weights: an HF checkpoint (safetensors or GGUF) -> the model's params, each placed on its sharding.

Each param is created with `jax.make_array_from_callback`: every device asks for its own slice, and the
param's `ParamSource` reads just that slice of the HF tensors behind it (memory-mapped safetensors), cast to
the target dtype. The whole checkpoint is checked before any read: a missing, unexpected or mis-shaped tensor
is one `ModelSourceError` naming the file and the tensor. Loading never executes code: safetensors and GGUF
only, no pickle, no remote code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from vllm_jax.model_loader import orbax_io
from vllm_jax.model_loader.checkpoint import Checkpoint, open_checkpoint
from vllm_jax.model_loader.param_source import ParamSource
from vllm_jax.model.registry import ModelEntry
from vllm_jax.model_loader.source import ModelSource, ModelSourceError

NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

ShardingFor = Callable[[tuple[str, ...], tuple[int, ...]], jax.sharding.Sharding]


def build_model(entry: ModelEntry, spec: Any, dtype: str, source: ModelSource | None, *,
                attention_backend: str = "auto", seed: int = 0, sharding_for: ShardingFor | None = None,
                model_kwargs: dict | None = None) -> nnx.Module:
    """The model with weights from `source` (or random weights when None: research scripts, tests), each param
    placed on `sharding_for(path, shape)` (default: the first device)."""
    jdtype = jnp.dtype(NP_DTYPES[dtype])
    sharding_for = sharding_for or _first_device
    extra = model_kwargs or {}
    make = lambda rngs: entry.model_class(spec, jdtype, rngs=rngs,  # noqa: E731
                                          attention_backend=attention_backend, **extra)
    if source is None:
        model = make(nnx.Rngs(seed))
        graphdef, state = nnx.split(model)
        pure = nnx.to_pure_dict(state)
        placed = {path: jax.device_put(value, sharding_for(path, value.shape))
                  for path, value in _flatten(pure).items()}
        nnx.replace_by_pure_dict(state, _unflatten(placed))
        return nnx.merge(graphdef, state)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: make(nnx.Rngs(0))))
    if source.kind == "orbax":
        nnx.replace_by_pure_dict(state, _restore_converted(source, nnx.to_pure_dict(state), sharding_for, dtype))
        return nnx.merge(graphdef, state)
    shapes = _flatten(nnx.to_pure_dict(state))
    checkpoint = open_checkpoint(source)
    sources = {path: src for path, src in entry.param_sources(spec).items() if path in shapes}
    unmapped = sorted(set(shapes) - set(sources))
    if unmapped:
        raise AssertionError(f"model params without a checkpoint mapping: {unmapped}")
    check_checkpoint(checkpoint, sources, {p: tuple(s.shape) for p, s in shapes.items()})
    np_dtype = NP_DTYPES[dtype]
    arrays = {}
    for path, src in sources.items():
        shape = tuple(shapes[path].shape)
        arrays[path] = jax.make_array_from_callback(
            shape, sharding_for(path, shape),
            lambda index, src=src, shape=shape: src.read(checkpoint, index, shape, np_dtype))
    nnx.replace_by_pure_dict(state, _unflatten(arrays))
    return nnx.merge(graphdef, state)


def _restore_converted(source: ModelSource, shapes: dict, sharding_for: ShardingFor, dtype: str) -> dict:
    """Params from a `vllm-jax convert` directory, restored onto their shardings, cast if --dtype differs."""
    directory = Path(source.path)
    stored = orbax_io.converted_dtype(directory)
    abstract = orbax_io.abstract_like(shapes, sharding_for, jnp.dtype(NP_DTYPES[stored]))
    try:
        restored = orbax_io.restore_params(directory, abstract)
    except Exception as exc:
        raise ModelSourceError(f"{directory / orbax_io.PARAMS_DIR}: cannot restore the converted params ({exc}); "
                               "convert the model again with `vllm-jax convert`") from exc
    if stored != dtype:
        restored = jax.tree.map(lambda a: a.astype(NP_DTYPES[dtype]), restored)
    return restored


def check_checkpoint(checkpoint: Checkpoint, sources: dict[tuple[str, ...], ParamSource],
                     shapes: dict[tuple[str, ...], tuple[int, ...]]) -> None:
    """Every needed tensor present with the shape the config implies; nothing unexpected."""
    available = checkpoint.names()
    needed: dict[str, tuple[int, ...]] = {}
    for path, src in sources.items():
        hf_shape = src.hf_shape(shapes[path])
        for name in src.names.flat:
            needed[name] = hf_shape
    missing = sorted(set(needed) - available)
    if missing:
        raise ModelSourceError(f"{checkpoint.path}: checkpoint lacks {len(missing)} tensor(s) the model needs, "
                               f"e.g. {', '.join(missing[:5])}")
    # A tied model's checkpoint may still carry lm_head.weight; it is not used.
    unexpected = sorted(n for n in available - set(needed)
                        if not n.endswith(_IGNORED_SUFFIXES) and n != "lm_head.weight")
    if unexpected:
        raise ModelSourceError(f"{checkpoint.where(unexpected[0])}: unexpected tensor(s) for this architecture: "
                               f"{', '.join(unexpected[:5])}")
    for name, shape in needed.items():
        got = checkpoint.shape(name)
        if got != shape:
            raise ModelSourceError(f"{checkpoint.where(name)}: tensor {name!r} has shape {got} but the config "
                                   f"implies {shape}")


def _first_device(path: tuple[str, ...], shape: tuple[int, ...]) -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _flatten(tree: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def _unflatten(flat: dict[tuple[str, ...], Any]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree
