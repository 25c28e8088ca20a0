"""Where one Mamba2 mixer's weights (the `w` of model/ssm/mamba2.py) come from in a transformers checkpoint
(Granite 4.0-H: `model.layers.{i}.mamba.*`), as data a family's weight map can turn into its param sources, and the
conversion itself for tensors already in memory (tests, tiny checkpoints)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from vllm_jax.model.ssm.mamba2 import Mamba2Spec


@dataclass(frozen=True)
class HfTensor:
    """One HF tensor under the mixer's prefix and how it becomes ours: "linear" ([out, in] -> [in, out]),
    "depthwise_conv" (Conv1d's [C, 1, K] -> [C, K]) or "as_is"."""

    name: str
    layout: str


def mamba2_hf_tensors(spec: Mamba2Spec) -> dict[str, HfTensor]:
    """Our key -> its HF tensor (names relative to the mixer, e.g. `model.layers.3.mamba.`); biases only where the
    spec has them."""
    tensors = {
        "in_proj": HfTensor("in_proj.weight", "linear"),
        "conv1d": HfTensor("conv1d.weight", "depthwise_conv"),
        "dt_bias": HfTensor("dt_bias", "as_is"),
        "A_log": HfTensor("A_log", "as_is"),
        "D": HfTensor("D", "as_is"),
        "norm": HfTensor("norm.weight", "as_is"),
        "out_proj": HfTensor("out_proj.weight", "linear"),
    }
    if spec.use_conv_bias:
        tensors["conv1d_bias"] = HfTensor("conv1d.bias", "as_is")
    if spec.use_proj_bias:
        tensors["in_proj_bias"] = HfTensor("in_proj.bias", "as_is")
        tensors["out_proj_bias"] = HfTensor("out_proj.bias", "as_is")
    return tensors


def mamba2_weights_from_hf(spec: Mamba2Spec, tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """One mixer's `w` from HF tensors by full name (`prefix` + the names above)."""
    w = {}
    for key, source in mamba2_hf_tensors(spec).items():
        tensor = np.asarray(tensors[prefix + source.name])
        if source.layout == "linear":
            tensor = tensor.T
        elif source.layout == "depthwise_conv":
            tensor = tensor.reshape(tensor.shape[0], tensor.shape[-1])
        w[key] = tensor
    return w
