"""`build_model`: a model family's entry, its spec and a `ModelSource` -> the model with every param on its sharding.

The module is built abstractly (`nnx.eval_shape`), so no param is allocated twice; the source's loader
(weight_loader.WeightLoader) then produces each param directly on its device(s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.quantization import GGUF, KeptFormats, OnlineQuantization, scheme_name
from vllm_jax.model_loader.abstract_weights import AbstractWeights
from vllm_jax.model_loader.checkpoint import Checkpoint
from vllm_jax.model_loader.gguf_file import GGUFCheckpoint
from vllm_jax.model_loader.gguf_file.kept import KeptGGUFLoader, kept_formats
from vllm_jax.model_loader.mxfp4_checkpoint import Mxfp4Checkpoint, is_mxfp4_checkpoint
from vllm_jax.model_loader.orbax_io import ConvertedLoader
from vllm_jax.model_loader.prequantized import read_prequantized_config
from vllm_jax.model_loader.prequantized_checkpoint import PrequantizedCheckpoint
from vllm_jax.model_loader.random_weights import RandomWeights
from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint
from vllm_jax.model_loader.source import ModelSource
from vllm_jax.model_loader.tensor_loader import TensorLoader
from vllm_jax.model_loader.weight_loader import (
    NP_DTYPES,
    LoadRequest,
    ShardingFor,
    WeightLoader,
    flatten_params,
    unflatten_params,
)
from vllm_jax.models.family import ModelFamily


def build_model(entry: ModelFamily, spec: Any, dtype: str, source: ModelSource | None, *,
                attention_backend: str = "auto", platform: str | None = None, mesh: jax.sharding.Mesh | None = None,
                seed: int = 0, sharding_for: ShardingFor | None = None,
                model_kwargs: dict | None = None,
                quantization: str | KeptFormats | OnlineQuantization | None = None,
                quantization_group_size: int | None = None, abstract: bool = False) -> nnx.Module:
    """The model with weights from `source` (or random weights when None: research scripts, tests), each param
    placed on `sharding_for(path, shape)` (default: the first device). `attention_backend`, `platform` and `mesh`
    are the model's (DecoderLM.__init__): what its attention calls and the chip the program is built for.
    `quantization` (int8 / fp8): the layers' linear weights are quantized as each is loaded (model/quantization.py),
    or read quantized from a pre-quantized checkpoint; `quantization_group_size`: its grouped scales' input rows.
    An `OnlineQuantization` (--quantization int8 / fp8 of a float checkpoint) quantizes the embedding and an untied
    LM head as they load too. A `KeptFormats` (--quantization gguf) places the GGUF's blocks it names as they are
    (gguf_file/kept.py). `abstract`: every param a ShapeDtypeStruct on its sharding instead, `source` unread
    (abstract_weights.py: ahead-of-time compiles)."""
    jdtype = jnp.dtype(NP_DTYPES[dtype])
    extra = dict(model_kwargs or {})
    if quantization is not None:
        extra["quantization"] = quantization
    if quantization_group_size is not None:
        extra["quantization_group_size"] = quantization_group_size

    def init_model(rngs: nnx.Rngs) -> nnx.Module:
        return entry.model_class(spec, jdtype, rngs=rngs, attention_backend=attention_backend, platform=platform,
                                 mesh=mesh, **extra)

    graphdef, state = nnx.split(nnx.eval_shape(lambda: init_model(nnx.Rngs(0))))
    shapes = {path: tuple(value.shape) for path, value in flatten_params(nnx.to_pure_dict(state)).items()}
    kept = quantization if isinstance(quantization, KeptFormats) else None
    request = LoadRequest(spec, shapes, dtype, sharding_for or _first_device, init_model,
                          None if kept else scheme_name(quantization))
    loader = AbstractWeights() if abstract else weight_loader_for(source, seed, kept)
    nnx.replace_by_pure_dict(state, unflatten_params(loader.load(request)))
    return nnx.merge(graphdef, state)


def model_quantization(model_config: Any) -> str | KeptFormats | OnlineQuantization | None:
    """What a ModelConfig's model is built with: its `quantization` (a pre-quantized checkpoint's scheme),
    OnlineQuantization for --quantization int8 / fp8 of a float checkpoint, or for gguf the file's kept formats."""
    if model_config.quantization_online:
        return OnlineQuantization(model_config.quantization)
    if model_config.quantization != GGUF:
        return model_config.quantization
    return kept_formats(model_config.source.path)


def weight_loader_for(source: ModelSource | None, seed: int = 0, kept: KeptFormats | None = None) -> WeightLoader:
    """The loader for the source's format (random weights from `seed` when there is no source; a GGUF's blocks
    placed as they are with `kept`)."""
    if source is None:
        if kept is not None:
            raise ValueError("quantization 'gguf' keeps a GGUF file's blocks; random weights have none")
        return RandomWeights(seed)
    if kept is not None:
        if source.kind != "gguf":
            raise ValueError(f"quantization 'gguf' keeps a GGUF file's blocks; {source.path} is not a GGUF file")
        return KeptGGUFLoader(source.path, kept)
    if source.kind == "orbax":
        return ConvertedLoader(Path(source.path))
    return TensorLoader(checkpoint_for(source))


def checkpoint_for(source: ModelSource) -> Checkpoint:
    """The HF-named tensors of a safetensors directory or a GGUF file (what TensorLoader reads)."""
    if source.kind == "gguf":
        return GGUFCheckpoint(source.path)
    checkpoint = SafetensorsCheckpoint(Path(source.path))
    if is_mxfp4_checkpoint(source.path):  # gpt-oss's MXFP4 experts, dequantized to the model dtype as they load
        return Mxfp4Checkpoint(checkpoint)
    prequantized = read_prequantized_config(source.path)
    if prequantized is not None:  # its quantized tensors read dequantized unless kept quantized
        return PrequantizedCheckpoint(checkpoint, prequantized)
    return checkpoint


def _first_device(path: tuple[str, ...], shape: tuple[int, ...]) -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])
