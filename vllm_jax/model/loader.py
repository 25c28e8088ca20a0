"""Weights: HF-named tensors (safetensors or GGUF) -> the decoder's stacked params -> an NNX model.

The checkpoint is read tensor by tensor (memory-mapped safetensors, GGUF dequantized one tensor at a time) into
pre-allocated stacked host arrays in the target dtype, then placed on the device once. A per-parameter mapping
table, not an if-chain, says where each HF tensor goes. Model loading never executes code: safetensors and
GGUF only, no pickle, no remote code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.source import ModelSource, ModelSourceError
from vllm_jax.model.spec import DecoderSpec

NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

# HF per-layer tensor suffix -> (our stacked param name, transpose?)
_LAYER_PARAMS: dict[str, tuple[str, bool]] = {
    "input_layernorm.weight": ("input_norm", False),
    "post_attention_layernorm.weight": ("post_attention_norm", False),
    "self_attn.q_proj.weight": ("q_proj", True),
    "self_attn.k_proj.weight": ("k_proj", True),
    "self_attn.v_proj.weight": ("v_proj", True),
    "self_attn.o_proj.weight": ("o_proj", True),
    "self_attn.q_proj.bias": ("q_bias", False),
    "self_attn.k_proj.bias": ("k_bias", False),
    "self_attn.v_proj.bias": ("v_bias", False),
    "self_attn.o_proj.bias": ("o_bias", False),
    "self_attn.q_norm.weight": ("q_norm", False),
    "self_attn.k_norm.weight": ("k_norm", False),
    "mlp.gate_proj.weight": ("gate_proj", True),
    "mlp.up_proj.weight": ("up_proj", True),
    "mlp.down_proj.weight": ("down_proj", True),
    "mlp.gate_proj.bias": ("gate_bias", False),
    "mlp.up_proj.bias": ("up_bias", False),
    "mlp.down_proj.bias": ("down_bias", False),
}
_GLOBAL_PARAMS: dict[str, tuple[str, bool]] = {
    "model.embed_tokens.weight": ("embed_tokens", False),
    "model.norm.weight": ("final_norm", False),
    "lm_head.weight": ("lm_head", True),
}
_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def build_model(spec: DecoderSpec, dtype: str, source: ModelSource | None, *, attention_backend: str = "auto",
                seed: int = 0) -> DecoderLM:
    """The model with weights from `source`, or random weights (research scripts, tests) when it is None."""
    jdtype = jnp.dtype(NP_DTYPES[dtype])
    if source is None:
        return DecoderLM(spec, jdtype, rngs=nnx.Rngs(seed), attention_backend=attention_backend)
    abstract = nnx.eval_shape(lambda: DecoderLM(spec, jdtype, rngs=nnx.Rngs(0), attention_backend=attention_backend))
    graphdef, state = nnx.split(abstract)
    arrays = load_param_arrays(spec, dtype, source)
    pure = nnx.to_pure_dict(state)
    _check_structure(pure, arrays)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, arrays))
    return nnx.merge(graphdef, state)


def load_param_arrays(spec: DecoderSpec, dtype: str, source: ModelSource) -> dict[str, Any]:
    """Host arrays shaped like the decoder's params, filled from the checkpoint's HF-named tensors."""
    target = _empty_params(spec, NP_DTYPES[dtype])
    filled: set[tuple[str, int | None]] = set()
    where = source.path
    for name, tensor, file in _iter_checkpoint(source):
        placed = _place(name, tensor, spec, target, file)
        if placed is not None:
            filled.add(placed)
    expected = {(k, None) for k in target if k != "layers"}
    expected |= {(k, i) for k in target["layers"] for i in range(spec.num_layers)}
    missing = sorted(expected - filled, key=str)
    if missing:
        names = [_hf_name(k, i) for k, i in missing[:5]]
        raise ModelSourceError(f"{where}: checkpoint lacks {len(missing)} tensor(s) the model needs, e.g. "
                               f"{', '.join(names)}")
    return target


def _place(name: str, tensor: np.ndarray, spec: DecoderSpec, target: dict, file: str) -> tuple | None:
    match = _LAYER_NAME.match(name)
    if match:
        layer, suffix = int(match.group(1)), match.group(2)
        if suffix not in _LAYER_PARAMS or layer >= spec.num_layers:
            return _ignored(name, file)
        key, transpose = _LAYER_PARAMS[suffix]
        if key not in target["layers"]:
            return _ignored(name, file)
        dest = target["layers"][key]
        _copy(dest[layer], tensor, transpose, name, file)
        return key, layer
    if name not in _GLOBAL_PARAMS:
        return _ignored(name, file)
    key, transpose = _GLOBAL_PARAMS[name]
    if key not in target:  # e.g. lm_head.weight in a checkpoint whose config ties embeddings
        return None
    _copy(target[key], tensor, transpose, name, file)
    return key, None


def _ignored(name: str, file: str) -> None:
    if name.endswith("rotary_emb.inv_freq"):
        return None
    raise ModelSourceError(f"{file}: unexpected tensor {name!r} for this architecture")


def _copy(dest: np.ndarray, tensor: np.ndarray, transpose: bool, name: str, file: str) -> None:
    expected = dest.shape[::-1] if transpose else dest.shape
    if tuple(tensor.shape) != tuple(expected):
        raise ModelSourceError(f"{file}: tensor {name!r} has shape {tuple(tensor.shape)} but the config implies "
                               f"{tuple(expected)}")
    dest[...] = (tensor.T if transpose else tensor).astype(dest.dtype, copy=False)


def _empty_params(spec: DecoderSpec, np_dtype) -> dict[str, Any]:
    """Zeroed host arrays with exactly the decoder's param tree (found by shape evaluation, not by hand)."""
    abstract = nnx.eval_shape(lambda: DecoderLM(spec, jnp.float32, rngs=nnx.Rngs(0)))
    pure = nnx.to_pure_dict(nnx.state(abstract))
    return jax.tree.map(lambda a: np.zeros(a.shape, np_dtype), pure)


def _check_structure(expected: dict, arrays: dict) -> None:
    if jax.tree.structure(expected) != jax.tree.structure(arrays):
        raise AssertionError("loaded params do not match the model's param tree")


def _hf_name(key: str, layer: int | None) -> str:
    table = _LAYER_PARAMS if layer is not None else _GLOBAL_PARAMS
    hf = next(n for n, (k, _) in table.items() if k == key)
    return f"model.layers.{layer}.{hf}" if layer is not None else hf


def _iter_checkpoint(source: ModelSource) -> Iterator[tuple[str, np.ndarray, str]]:
    if source.kind == "gguf":
        from vllm_jax.model.gguf_file import iter_gguf_tensors

        for name, tensor in iter_gguf_tensors(source.path):
            yield name, tensor, source.path
        return
    yield from _iter_safetensors(Path(source.path))


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's shards: those named by model.safetensors.index.json, else every *.safetensors."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelSourceError(f"{index}: not a valid safetensors index ({exc})") from exc
        files = [directory / f for f in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise ModelSourceError(f"{index}: names shard {f.name}, which is missing")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelSourceError(f"{directory}: no *.safetensors files (only safetensors and GGUF weights are loaded; "
                               "pickled .bin checkpoints are refused because loading them can run code)")
    return files


def _iter_safetensors(directory: Path) -> Iterator[tuple[str, np.ndarray, str]]:
    from safetensors import safe_open

    for file in safetensors_files(directory):
        try:
            handle = safe_open(str(file), framework="numpy")
        except Exception as exc:
            raise ModelSourceError(f"{file}: cannot read safetensors file ({exc})") from exc
        with handle as f:
            for name in f.keys():
                try:
                    tensor = f.get_tensor(name)
                except Exception as exc:
                    raise ModelSourceError(f"{file}: cannot read tensor {name!r} ({exc})") from exc
                yield name, tensor, str(file)
