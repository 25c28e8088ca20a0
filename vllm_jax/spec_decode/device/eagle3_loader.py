"""`load_eagle3_head`: an EAGLE-3 head directory (config.json + safetensors) -> an `Eagle3Head` with its weights
placed, its spec read from the config.

The config is read as plain JSON (published heads say `"model_type": "llama"` with keys transformers does not
know, and nothing here needs transformers' defaults). The checkpoint is checked whole before any read, as the
target's is (`tensor_loader.check_checkpoint`): a missing, unexpected or mis-shaped tensor is one
`ModelSourceError` (a ValueError) naming the file and the tensor. `d2t` may be absent only when the draft
vocabulary is the target's; its offsets must land inside the target vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vllm_jax.model_loader.param_source import ParamSource, single
from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint
from vllm_jax.model_loader.source import ModelSourceError
from vllm_jax.model_loader.tensor_loader import check_checkpoint
from vllm_jax.model_loader.weight_loader import NP_DTYPES, ParamPath, ShardingFor, flatten_params, unflatten_params
from vllm_jax.spec_decode.device.eagle3_head import Eagle3Head
from vllm_jax.spec_decode.device.eagle3_spec import Eagle3Spec, eagle3_spec_from_config
from vllm_jax.spec_decode.device.eagle3_weights import D2T, T2D, eagle3_param_sources, layer_prefix


def read_eagle3_spec(directory: str | Path) -> Eagle3Spec:
    """The head's spec from `directory/config.json`; an unreadable or unsupported config names the file."""
    config_path = Path(directory) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelSourceError(f"{config_path}: cannot read config.json ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelSourceError(f"{config_path}: not a JSON object")
    try:
        return eagle3_spec_from_config(SimpleNamespace(**config))
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ModelSourceError(f"{config_path}: {exc}") from exc


def load_eagle3_head(directory: str | Path, dtype: str = "float32", *, attention_backend: str = "auto",
                     platform: str | None = None, mesh: jax.sharding.Mesh | None = None,
                     sharding_for: ShardingFor | None = None, abstract: bool = False) -> Eagle3Head:
    """The head with every param read from the directory's safetensors, in `dtype` (d2t stays int32), each on
    `sharding_for(path, shape)` (default: the first device). Kernel arguments as for the target model.
    `abstract`: the same checks, every param a ShapeDtypeStruct on its sharding instead (ahead-of-time
    compiles)."""
    directory = Path(directory)
    spec = read_eagle3_spec(directory)
    checkpoint = SafetensorsCheckpoint(directory)
    names = checkpoint.names()
    jdtype = jnp.dtype(NP_DTYPES[dtype])
    shaped = nnx.eval_shape(lambda: Eagle3Head(
        spec, jdtype, rngs=nnx.Rngs(0), own_embedding="embed_tokens.weight" in names,
        attention_backend=attention_backend, platform=platform, mesh=mesh))
    graphdef, state = nnx.split(shaped)
    shapes = {path: tuple(value.shape) for path, value in flatten_params(nnx.to_pure_dict(state)).items()}
    sources = {path: src for path, src in eagle3_param_sources(layer_prefix(names)).items() if path in shapes}
    unmapped = sorted(set(shapes) - set(sources))
    if unmapped:
        raise AssertionError(f"EAGLE-3 head params without a checkpoint mapping: {unmapped}")
    if D2T not in names and spec.draft_vocab_size == spec.vocab_size:
        del sources[("d2t",)]  # the draft vocabulary is the target's: offsets 0
    checked: dict[ParamPath, ParamSource] = dict(sources)
    checked_shapes = dict(shapes)
    if T2D in names:  # not read, but checked like the rest
        checked[("t2d",)], checked_shapes[("t2d",)] = single(T2D), (spec.vocab_size,)
    check_checkpoint(checkpoint, checked, checked_shapes)
    place = sharding_for or _first_device
    arrays = {}
    for path, src in sources.items():
        shape = shapes[path]
        np_dtype = np.int32 if path == ("d2t",) else NP_DTYPES[dtype]
        if abstract:
            arrays[path] = jax.ShapeDtypeStruct(shape, np_dtype, sharding=place(path, shape))
            continue
        arrays[path] = jax.make_array_from_callback(
            shape, place(path, shape),
            lambda index, src=src, shape=shape, np_dtype=np_dtype: src.read(checkpoint, index, shape, np_dtype))
    if ("d2t",) in arrays:
        _check_d2t(checkpoint, spec)
    else:
        zeros, where = np.zeros(spec.draft_vocab_size, np.int32), place(("d2t",), shapes[("d2t",)])
        arrays[("d2t",)] = (jax.ShapeDtypeStruct(zeros.shape, zeros.dtype, sharding=where) if abstract
                            else jax.device_put(zeros, where))
    nnx.replace_by_pure_dict(state, unflatten_params(arrays))
    return nnx.merge(graphdef, state)


def _check_d2t(checkpoint: SafetensorsCheckpoint, spec: Eagle3Spec) -> None:
    """Every draft id's target (`draft + d2t[draft]`) inside the target vocabulary."""
    offsets = checkpoint.read(D2T, (slice(None),)).astype(np.int64)
    targets = np.arange(spec.draft_vocab_size) + offsets
    bad = np.flatnonzero((targets < 0) | (targets >= spec.vocab_size))
    if bad.size:
        raise ModelSourceError(f"{checkpoint.where(D2T)}: tensor 'd2t' maps draft id {int(bad[0])} to target id "
                               f"{int(targets[bad[0]])}, outside the target vocabulary (vocab_size "
                               f"{spec.vocab_size})")


def _first_device(path: ParamPath, shape: tuple[int, ...]) -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])
