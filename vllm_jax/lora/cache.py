"""Loaded adapters kept in host memory, LRU (`--max-cpu-loras`), so a slot rewrite does not read the disk."""

from __future__ import annotations

import threading
from collections import OrderedDict

from vllm_jax.lora.adapter import LoRAAdapter, TargetShapes, load_peft_adapter
from vllm_jax.lora.request import LoRARequest


class AdapterCache:
    """adapter id -> LoRAAdapter, at most `capacity` of them; `get` loads (and checks) on a miss. Thread-safe:
    the engine thread and a server handler may both load."""

    def __init__(self, capacity: int, shapes: TargetShapes, max_rank: int):
        self.capacity, self.shapes, self.max_rank = capacity, shapes, max_rank
        self._adapters: OrderedDict[int, LoRAAdapter] = OrderedDict()
        self._lock = threading.Lock()
        self.num_loads = 0  # reads from disk (tests and stats)

    def get(self, request: LoRARequest) -> LoRAAdapter:
        with self._lock:
            adapter = self._adapters.get(request.lora_int_id)
            if adapter is not None:
                if adapter.request.lora_name != request.lora_name:
                    raise ValueError(f"lora_int_id {request.lora_int_id} is adapter "
                                     f"{adapter.request.lora_name!r}, not {request.lora_name!r}")
                self._adapters.move_to_end(request.lora_int_id)
                return adapter
        adapter = load_peft_adapter(request, self.shapes, self.max_rank)  # outside the lock: disk reads
        with self._lock:
            self.num_loads += 1
            self._adapters[request.lora_int_id] = adapter
            self._adapters.move_to_end(request.lora_int_id)
            while len(self._adapters) > self.capacity:
                self._adapters.popitem(last=False)
        return adapter

    def remove(self, adapter_id: int) -> None:
        with self._lock:
            self._adapters.pop(adapter_id, None)

    def __contains__(self, adapter_id: int) -> bool:
        return adapter_id in self._adapters
