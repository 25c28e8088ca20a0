"""LoRAConfig: the `--enable-lora` family of flags, validated once (config.py builds it)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from vllm_jax.lora.request import LoRARequest

# PEFT module names the dense decoders here can carry an adapter on (HF names of the layers' linears).
SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_TARGETS = SUPPORTED_TARGETS[:4]


@dataclass(frozen=True)
class LoRAConfig:
    """`max_loras`: adapters resident on the device at once (slots 1..max_loras; slot 0 is "no adapter");
    `max_lora_rank`: the slots' rank R (an adapter of smaller rank is zero-padded); `max_cpu_loras`: loaded
    adapters kept in host memory (LRU); `lora_modules`: adapters known by name from the start (the server's
    `--lora-modules`)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 1
    lora_modules: tuple[LoRARequest, ...] = ()

    @classmethod
    def create(cls, max_loras: int, max_lora_rank: int, max_cpu_loras: int | None,
               lora_modules: object) -> LoRAConfig:
        for name, value in (("max_loras", max_loras), ("max_lora_rank", max_lora_rank)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if max_cpu_loras is None:
            max_cpu_loras = max_loras
        if isinstance(max_cpu_loras, bool) or not isinstance(max_cpu_loras, int) or max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras!r}) must be an integer >= max_loras ({max_loras})")
        return cls(max_loras, max_lora_rank, max_cpu_loras, parse_lora_modules(lora_modules))


def parse_lora_modules(value: object) -> tuple[LoRARequest, ...]:
    """`lora_modules` as vLLM takes it: `name=path` strings, vLLM's JSON objects (`{"name", "path",
    "base_model_name"}`, as text or dicts), or LoRARequests; ids are given 1, 2, ... in order."""
    if value is None:
        return ()
    items = [value] if isinstance(value, (str, dict, LoRARequest)) else list(value)
    out: list[LoRARequest] = []
    for i, item in enumerate(items, start=1):
        if isinstance(item, LoRARequest):
            out.append(item)
            continue
        if isinstance(item, str) and item.lstrip().startswith("{"):
            item = json.loads(item)
        if isinstance(item, dict):
            if "name" not in item or "path" not in item:
                raise ValueError(f"lora_modules: {item!r} needs 'name' and 'path'")
            out.append(LoRARequest(item["name"], i, item["path"], item.get("base_model_name")))
        elif isinstance(item, str) and "=" in item:
            name, path = item.split("=", 1)
            out.append(LoRARequest(name.strip(), i, path.strip()))
        else:
            raise ValueError(f"lora_modules: {item!r} is not name=path or a JSON object with name and path")
    names = [r.lora_name for r in out]
    if len(set(names)) != len(names):
        raise ValueError(f"lora_modules: adapter names repeat: {names}")
    return tuple(out)
