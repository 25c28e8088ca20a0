"""Pre-quantized HF checkpoints: what config.json's `quantization_config` says, checked once, before any read.

Two formats are read (docs/architecture/06-model.md, "Quantized weights"):
- compressed-tensors (`quant_method: compressed-tensors`; llm-compressor's output): weights in 8 bits, int or
  float (e4m3), symmetric, one scale per output channel (`weight_scale` [out, 1]), per tensor ([1] or []) or per
  [128 x 128] block (strategy `block`); activations unquantized or dynamic (no stored input scales). Modules on its
  `ignore` list are stored in float.
- fp8 (`quant_method: fp8`, as DeepSeek-V3 and Qwen3-FP8 ship): e4m3 weights with `weight_scale_inv`
  [ceil(out / b0), ceil(in / b1)] for `weight_block_size: [b0, b1]` (despite the name, w = values * scale_inv),
  or, without a block size, one `weight_scale` per tensor; `activation_scheme` must be dynamic.

Everything else (int4, asymmetric, group strategy, static activation scales, other methods) is refused here with
one ModelSourceError naming what is unsupported: nothing is loaded half-way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_jax.model_loader.errors import ModelSourceError

# the names --quantization accepts for a checkpoint's own quantization (besides our schemes int8 / fp8)
METHODS = ("compressed-tensors", "fp8")
_CT_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")
_STRATEGIES = ("channel", "tensor", "block")


@dataclass(frozen=True)
class PrequantizedConfig:
    """A checkpoint's quantization, reduced to what the loader needs."""

    method: str  # compressed-tensors | fp8
    scheme: str  # our storage scheme (model/quantization.py): int8 | fp8
    strategies: frozenset[str]  # how the stored scales are laid out: channel, tensor and / or block
    scale_suffix: str  # `weight_scale` or `weight_scale_inv`, next to each quantized `weight`
    block: tuple[int, int] | None = None  # [out, in] block of a block scale
    ignore: tuple[str, ...] = ()  # module names, or `re:` patterns, stored unquantized

    @property
    def group_size(self) -> int | None:
        """Input rows per grouped scale: a block's width (a block scale is repeated over its output rows)."""
        return None if self.block is None else self.block[1]

    def is_ignored(self, module: str) -> bool:
        for entry in self.ignore:
            if entry.startswith("re:") and re.match(entry[3:], module):
                return True
            if entry == module:
                return True
        return False

    def describe(self) -> str:
        return f"{self.method} ({self.scheme}, {'/'.join(sorted(self.strategies))} scales)"


def read_prequantized_config(model_dir: str | Path) -> PrequantizedConfig | None:
    """The checkpoint's quantization from `model_dir`/config.json, or None for a float checkpoint."""
    config_path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(config_path.read_text()).get("quantization_config")
    except (OSError, json.JSONDecodeError):
        return None  # load_hf_config reports an unreadable config.json
    if raw is None:
        return None
    where = f"{config_path}: quantization_config"
    if not isinstance(raw, dict):
        raise ModelSourceError(f"{where} must be an object; got {raw!r}")
    method = raw.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(raw, where)
    if method == "fp8":
        return _fp8(raw, where)
    if method == "mxfp4":  # gpt-oss's experts, dequantized as they load (mxfp4_checkpoint.py): a float model here
        return None
    raise ModelSourceError(f"{where}: quant_method {method!r} is not supported (supported: "
                           f"{', '.join(METHODS)} with 8-bit weights)")


def _compressed_tensors(raw: dict[str, Any], where: str) -> PrequantizedConfig:
    fmt = raw.get("format")
    if fmt not in _CT_FORMATS:
        raise ModelSourceError(f"{where}: compressed-tensors format {fmt!r} is not supported (supported: "
                               f"{', '.join(_CT_FORMATS)}; packed int4 and sparse formats are not)")
    groups = raw.get("config_groups") or {}
    if not groups:
        raise ModelSourceError(f"{where}: compressed-tensors without config_groups: nothing says how weights are "
                               "quantized")
    schemes, strategies, blocks = set(), set(), set()
    for name, group in groups.items():
        gwhere = f"{where}.config_groups.{name}"
        weights = group.get("weights")
        if not weights:
            raise ModelSourceError(f"{gwhere}: a group without quantized weights is not supported")
        scheme, strategy, block = _ct_weights(weights, f"{gwhere}.weights")
        _ct_activations(group.get("input_activations"), f"{gwhere}.input_activations")
        if group.get("output_activations"):
            raise ModelSourceError(f"{gwhere}.output_activations: quantized outputs are not supported")
        if group.get("format") not in (None, *_CT_FORMATS):
            raise ModelSourceError(f"{gwhere}: format {group['format']!r} is not supported")
        schemes.add(scheme)
        strategies.add(strategy)
        if block is not None:
            blocks.add(block)
    if len(schemes) > 1 or len(blocks) > 1:
        raise ModelSourceError(f"{where}: groups mix {' and '.join(sorted(schemes))} weights or block sizes; one "
                               "scheme per model is supported")
    if raw.get("sparsity_config"):
        raise ModelSourceError(f"{where}: sparsity_config (sparse compressed weights) is not supported")
    if raw.get("kv_cache_scheme"):
        raise ModelSourceError(f"{where}: kv_cache_scheme (KV scales stored in the checkpoint) is not supported; "
                               "use --kv-cache-dtype fp8 for an fp8 KV cache")
    ignore = raw.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(e, str) for e in ignore):
        raise ModelSourceError(f"{where}.ignore must be a list of module names; got {ignore!r}")
    return PrequantizedConfig("compressed-tensors", schemes.pop(), frozenset(strategies), "weight_scale",
                              blocks.pop() if blocks else None, tuple(ignore))


def _ct_weights(weights: dict[str, Any], where: str) -> tuple[str, str, tuple[int, int] | None]:
    """(scheme, strategy, block) of one group's weight args; every unsupported field is named."""
    if weights.get("num_bits") != 8:
        raise ModelSourceError(f"{where}: num_bits {weights.get('num_bits')!r} is not supported (8-bit weights "
                               "only; int4 is not built)")
    kind = weights.get("type")
    if kind not in ("int", "float"):
        raise ModelSourceError(f"{where}: type {kind!r} is not supported (int or float)")
    if weights.get("symmetric") is not True:
        raise ModelSourceError(f"{where}: asymmetric weights (symmetric: {weights.get('symmetric')!r}, zero "
                               "points) are not supported")
    if weights.get("dynamic"):
        raise ModelSourceError(f"{where}: dynamic weight quantization is not supported")
    strategy = weights.get("strategy")
    if strategy not in _STRATEGIES:
        raise ModelSourceError(f"{where}: strategy {strategy!r} is not supported (channel, tensor, or block for "
                               "float weights)")
    block = None
    if strategy == "block":
        block = weights.get("block_structure")
        if kind != "float" or not (isinstance(block, list) and len(block) == 2 and all(
                isinstance(b, int) and b > 0 for b in block)):
            raise ModelSourceError(f"{where}: block strategy needs float weights and block_structure [out, in]; "
                                   f"got type {kind!r}, block_structure {block!r}")
        block = (block[0], block[1])
    if weights.get("actorder"):
        raise ModelSourceError(f"{where}: actorder {weights['actorder']!r} is not supported")
    return ("int8" if kind == "int" else "fp8"), strategy, block


def _ct_activations(acts: dict[str, Any] | None, where: str) -> None:
    """Activations unquantized, or quantized dynamically (computed per token at run time: nothing stored). Our
    matmul decides for itself how activations run (model/quantization.py)."""
    if acts is None:
        return
    if not acts.get("dynamic"):
        raise ModelSourceError(f"{where}: static activation scales (dynamic: {acts.get('dynamic')!r}, stored "
                               "input_scale) are not supported; dynamic or no activation quantization only")
    if acts.get("num_bits") != 8 or acts.get("symmetric") is False:
        raise ModelSourceError(f"{where}: only symmetric 8-bit dynamic activations are supported; got num_bits "
                               f"{acts.get('num_bits')!r}, symmetric {acts.get('symmetric')!r}")


def _fp8(raw: dict[str, Any], where: str) -> PrequantizedConfig:
    if raw.get("fmt", "e4m3") != "e4m3":
        raise ModelSourceError(f"{where}: fmt {raw.get('fmt')!r} is not supported (e4m3 only)")
    if raw.get("activation_scheme", "dynamic") != "dynamic":
        raise ModelSourceError(f"{where}: activation_scheme {raw.get('activation_scheme')!r} is not supported "
                               "(dynamic only: static input scales are not read)")
    ignore = tuple(raw.get("ignored_layers") or raw.get("modules_to_not_convert") or ())
    block = raw.get("weight_block_size")
    if block is None:
        return PrequantizedConfig("fp8", "fp8", frozenset({"tensor"}), "weight_scale", None, ignore)
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ModelSourceError(f"{where}: weight_block_size must be [out, in] positive integers; got {block!r}")
    return PrequantizedConfig("fp8", "fp8", frozenset({"block"}), "weight_scale_inv", (block[0], block[1]), ignore)


def resolve_quantization(requested: str | None, checkpoint: PrequantizedConfig | None, model: str) -> str | None:
    """Our scheme (int8 / fp8) for `--quantization` and the checkpoint's own: as vLLM, a pre-quantized checkpoint's
    quantization comes from the checkpoint; the flag may be omitted or must agree (its method name, or the scheme
    its values are stored in). A conflict is a ValueError naming both."""
    if checkpoint is None:
        if requested == "compressed-tensors":
            raise ValueError(f"quantization {requested!r} reads a pre-quantized checkpoint, but {model} has no "
                             "quantization_config in its config.json")
        return requested
    if requested is None or requested in (checkpoint.method, checkpoint.scheme):
        return checkpoint.scheme
    raise ValueError(f"quantization {requested!r} conflicts with {model}'s quantization_config "
                     f"({checkpoint.describe()}); omit --quantization or pass {checkpoint.method!r}")
