"""PEFT LoRA adapters read into host arrays laid out for the device slots (lora/device/slots.py).

A PEFT directory holds `adapter_config.json` (r, lora_alpha, use_rslora, target_modules, ...) and
`adapter_model.safetensors` with, per layer and module, `lora_A.weight` [r, in] and `lora_B.weight` [out, r];
the module computes base(x) + B(A(x)) * scaling with scaling = lora_alpha / r (lora_alpha / sqrt(r) with
use_rslora). Here each target becomes a [L, in, r] and b [L, r, out] with the scaling folded into b, so the device
computes (x @ a) @ b. Everything is checked before anything is returned: a bad adapter raises ValueError and
leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vllm_jax.lora.config import SUPPORTED_TARGETS
from vllm_jax.lora.request import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# PEFT's per-expert layout (one A/B per expert: Mixtral's w1/w3/w2, Qwen3-MoE's gate/up/down_proj) and its target
_EXPERT_KEY = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                         r"(\w+)\.lora_([AB])\.weight$")
# the fused 3-D layout: PEFT's target_parameters on transformers 5's experts.gate_up_proj [E, 2I, H] and
# experts.down_proj [E, H, I], one A [r * E, in] / B [out, r * E] per tensor (nested: base_layer for the first)
_FUSED_KEY = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\."
                        r"((?:base_layer\.)*)lora_([AB])\.weight$")
EXPERT_TARGETS = {"w1": "experts_gate", "gate_proj": "experts_gate", "w3": "experts_up", "up_proj": "experts_up",
                  "w2": "experts_down", "down_proj": "experts_down"}


@dataclass(frozen=True)
class TargetShapes:
    """What an adapter must fit: the model's layer count and each target module's (in, out) features."""

    num_layers: int
    features: dict[str, tuple[int, int]]  # module name -> (in, out)
    num_experts: int = 0  # MoE: the expert targets (EXPERT_TARGETS' values) carry one A/B per expert

    def lead(self, module: str) -> tuple[int, ...]:
        """The leading dims of a target's arrays: (layers,) or (layers, experts) for an expert target."""
        return (self.num_layers, self.num_experts) if module.startswith("experts_") else (self.num_layers,)


@dataclass
class LoRAAdapter:
    """One loaded adapter: per target module, a [L, in, r] and b [L, r, out] float32 (scaling folded into b;
    zeros for layers the adapter leaves alone); an expert target's are [L, E, in, r] / [L, E, r, out]."""

    request: LoRARequest
    rank: int
    scaling: float
    weights: dict[str, tuple[np.ndarray, np.ndarray]] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def load_peft_adapter(request: LoRARequest, shapes: TargetShapes, max_rank: int) -> LoRAAdapter:
    """Read and check the PEFT adapter at `request.lora_path` (ValueError naming the adapter and the problem)."""
    name = request.lora_name
    path = Path(request.lora_path) if request.lora_path else None
    if path is None or not path.is_dir():
        raise ValueError(f"LoRA adapter {name!r}: {request.lora_path!r} is not a directory")
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / file).is_file():
            raise ValueError(f"LoRA adapter {name!r}: {path / file} is missing (a PEFT adapter has "
                             f"{CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"LoRA adapter {name!r}: {path / CONFIG_FILE} is not valid JSON ({e})") from e
    rank, scaling = _rank_and_scaling(name, config, max_rank)
    _check_targets(name, config.get("target_modules"))
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except Exception as e:  # a truncated or foreign file: safetensors' own message says which
        raise ValueError(f"LoRA adapter {name!r}: cannot read {path / WEIGHTS_FILE} ({e})") from e
    weights = _layout(name, tensors, shapes, rank, scaling)
    return LoRAAdapter(request, rank, scaling, weights)


def _rank_and_scaling(name: str, config: dict, max_rank: int) -> tuple[int, float]:
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {name!r}: peft_type {config.get('peft_type')!r} is not LORA")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA adapter {name!r}: r must be a positive integer; got {rank!r}")
    if rank > max_rank:
        raise ValueError(f"LoRA adapter {name!r}: rank {rank} is larger than max_lora_rank ({max_rank}); raise "
                         "--max-lora-rank")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise ValueError(f"LoRA adapter {name!r}: lora_alpha must be a number; got {alpha!r}")
    for key, unsupported in (("use_dora", True), ("fan_in_fan_out", True)):
        if config.get(key) == unsupported:
            raise ValueError(f"LoRA adapter {name!r}: {key}={unsupported} is not supported")
    if config.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {name!r}: bias={config['bias']!r} is not supported (only 'none')")
    if config.get("modules_to_save"):
        raise ValueError(f"LoRA adapter {name!r}: modules_to_save {config['modules_to_save']} is not supported")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"LoRA adapter {name!r}: per-module rank_pattern / alpha_pattern is not supported")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _check_targets(name: str, targets: object) -> None:
    """A list of module names must name modules the model has; a regex (str) is checked by the weights' keys."""
    if targets is None or isinstance(targets, str):
        return
    unknown = sorted(t for t in targets if t.split(".")[-1] not in SUPPORTED_TARGETS + tuple(EXPERT_TARGETS))
    if unknown:
        raise ValueError(f"LoRA adapter {name!r}: target modules {unknown} are not in the model (supported: "
                         f"{', '.join(SUPPORTED_TARGETS)})")


def _layout(name: str, tensors: dict[str, np.ndarray], shapes: TargetShapes, rank: int,
            scaling: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The tensors as per-target [L, in, r] / [L, r, out] arrays, every key and shape checked."""
    found: dict[tuple[str, int, int | None], dict[str, np.ndarray]] = {}
    found |= _split_fused_experts(name, tensors, shapes, rank)
    for key, value in tensors.items():
        if _FUSED_KEY.match(key):
            continue
        layer, module, expert, which = _parse_key(name, key, shapes)
        if module not in shapes.features:
            raise ValueError(f"LoRA adapter {name!r}: target module {module!r} is not in the model (supported: "
                             f"{', '.join(shapes.features)})")
        if layer >= shapes.num_layers:
            raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} names layer {layer}, but the model has "
                             f"{shapes.num_layers} layers")
        found.setdefault((module, layer, expert), {})[which] = value
    if not found:
        raise ValueError(f"LoRA adapter {name!r}: no LoRA weights in {WEIGHTS_FILE}")
    weights: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for (module, layer, expert), pair in sorted(found.items(), key=lambda item: (item[0][0], item[0][1],
                                                                                 item[0][2] or 0)):
        fin, fout = shapes.features[module]
        where = f"layer {layer} {module}" + (f" expert {expert}" if expert is not None else "")
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: {where} has lora_{''.join(pair)} only")
        a, b = pair["A"], pair["B"]
        if a.shape != (rank, fin) or b.shape != (fout, rank):
            raise ValueError(f"LoRA adapter {name!r}: {where} has lora_A {list(a.shape)} and lora_B "
                             f"{list(b.shape)}; the model needs [{rank}, {fin}] and [{fout}, {rank}]")
        if module not in weights:
            lead = shapes.lead(module)
            weights[module] = (np.zeros(lead + (fin, rank), np.float32), np.zeros(lead + (rank, fout), np.float32))
        index = (layer,) if expert is None else (layer, expert)
        weights[module][0][index] = a.astype(np.float32).T
        weights[module][1][index] = b.astype(np.float32).T * np.float32(scaling)
    return weights


def _split_fused_experts(name: str, tensors: dict[str, np.ndarray], shapes: TargetShapes,
                         rank: int) -> dict[tuple[str, int, int], dict[str, np.ndarray]]:
    """The fused layout's pairs as per-expert A/B, PEFT's ParamWrapper rule: expert e's A is rows e*r..(e+1)*r of
    A, its B columns e, e+E, ... of B (B reshaped [out, r, E]); gate_up's B rows split into gate then up (the
    order transformers 5 chunks them in). Which tensor a pair wraps is read off its shape."""
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        match = _FUSED_KEY.match(key)
        if match is not None:
            pairs.setdefault((int(match[1]), match[2]), {})[match[3]] = value
    if pairs and not shapes.num_experts:
        raise ValueError(f"LoRA adapter {name!r}: it has fused expert tensors, but the model has no experts")
    out: dict[tuple[str, int, int], dict[str, np.ndarray]] = {}
    e = shapes.num_experts
    h, i = shapes.features["experts_gate"] if e else (0, 0)
    for (layer, nesting), pair in pairs.items():
        where = f"layer {layer} fused experts tensor ({nesting or ''}lora_A/B)"
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: {where} has lora_{''.join(pair)} only")
        a, b = pair["A"], pair["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank * e or b.shape[1] != rank * e:
            raise ValueError(f"LoRA adapter {name!r}: {where} has lora_A {list(a.shape)} and lora_B "
                             f"{list(b.shape)}; the fused layout needs r * experts = {rank * e} rows of A and "
                             "columns of B")
        fin, fout = a.shape[1], b.shape[0]
        if (fin, fout) == (h, 2 * i):
            parts = {"experts_gate": slice(0, i), "experts_up": slice(i, 2 * i)}
        elif (fin, fout) == (i, h):
            parts = {"experts_down": slice(None)}
        else:
            raise ValueError(f"LoRA adapter {name!r}: {where} maps {fin} to {fout} features, which is neither the "
                             f"experts' gate_up_proj ({h} -> {2 * i}) nor their down_proj ({i} -> {h})")
        a_experts = a.reshape(e, rank, fin)
        b_experts = b.reshape(fout, rank, e)
        for expert in range(e):
            for module, rows in parts.items():
                out[(module, layer, expert)] = {"A": a_experts[expert], "B": b_experts[rows, :, expert]}
    return out


def _parse_key(name: str, key: str, shapes: TargetShapes) -> tuple[int, str, int | None, str]:
    """A tensor name -> (layer, target, expert or None, "A" | "B"); ValueError for a name outside the layouts."""
    match = _EXPERT_KEY.match(key)
    if match is not None:
        if not shapes.num_experts:
            raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is an expert's, but the model has no experts")
        layer, expert, module, which = int(match[1]), int(match[2]), match[3], match[4]
        if module not in EXPERT_TARGETS:
            raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} names expert module {module!r} (supported: "
                             f"{', '.join(EXPERT_TARGETS)})")
        if expert >= shapes.num_experts:
            raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} names expert {expert}, but the model has "
                             f"{shapes.num_experts}")
        return layer, EXPERT_TARGETS[module], expert, which
    if ".experts." in key:
        raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is in no experts layout read here (PEFT's "
                         "per-expert experts.{e}.w1 / gate_proj ..., or the fused experts.lora_A / lora_B)")
    match = _KEY.match(key)
    if match is not None:
        return int(match[1]), match[2], None, match[3]
    raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA A/B weight of a layer's "
                     f"{'/'.join(SUPPORTED_TARGETS)} (the model has no such target module)")
