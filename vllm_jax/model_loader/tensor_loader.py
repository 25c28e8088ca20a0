"""HF-named tensors -> params: the loader for safetensors shards and GGUF files alike.

Each param is created with `jax.make_array_from_callback`: every device asks for its own slice, and the
param's `ParamSource` (from the architecture's weight map) reads just that slice of the HF tensors behind it,
cast to the target dtype. So no device needs a full host copy of the model. The whole checkpoint is checked
before any read: a missing, unexpected or mis-shaped tensor is one `ModelSourceError` naming the file and
the tensor. Loading never executes code: safetensors and GGUF only, no pickle, no remote code.
"""

from __future__ import annotations

import jax

from vllm_jax.model_loader.checkpoint import Checkpoint
from vllm_jax.model_loader.param_source import ParamSource
from vllm_jax.model_loader.source import ModelSourceError
from vllm_jax.model_loader.weight_loader import NP_DTYPES, LoadRequest, ParamPath
from vllm_jax.model_loader.weight_maps import param_sources

# A tied model's checkpoint may still carry lm_head.weight; old ones carry rotary tables. Neither is read.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_IGNORED_NAMES = ("lm_head.weight",)


class TensorLoader:
    """Params read from a `Checkpoint` through the architecture's weight map."""

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint

    def load(self, request: LoadRequest) -> dict[ParamPath, jax.Array]:
        sources = {path: src for path, src in param_sources(request.spec).items() if path in request.shapes}
        unmapped = sorted(set(request.shapes) - set(sources))
        if unmapped:
            raise AssertionError(f"model params without a checkpoint mapping: {unmapped}")
        check_checkpoint(self.checkpoint, sources, request.shapes)
        np_dtype = NP_DTYPES[request.dtype]
        arrays = {}
        for path, src in sources.items():
            shape = request.shapes[path]
            arrays[path] = jax.make_array_from_callback(
                shape, request.sharding_for(path, shape),
                lambda index, src=src, shape=shape: src.read(self.checkpoint, index, shape, np_dtype))
        return arrays


def check_checkpoint(checkpoint: Checkpoint, sources: dict[ParamPath, ParamSource],
                     shapes: dict[ParamPath, tuple[int, ...]]) -> None:
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
    unexpected = sorted(n for n in available - set(needed)
                        if not n.endswith(_IGNORED_SUFFIXES) and n not in _IGNORED_NAMES)
    if unexpected:
        raise ModelSourceError(f"{checkpoint.where(unexpected[0])}: unexpected tensor(s) for this architecture: "
                               f"{', '.join(unexpected[:5])}")
    for name, shape in needed.items():
        got = checkpoint.shape(name)
        if got != shape:
            raise ModelSourceError(f"{checkpoint.where(name)}: tensor {name!r} has shape {got} but the config "
                                   f"implies {shape}")
