"""Which adapter sits in which device slot: LRU over the slots not pinned by a running request.

The scheduler owns it (pure Python): admitting a request with an adapter pins that adapter's slot, loading the
adapter into a free or least recently used unpinned slot when it is not resident; a request that finds every slot
pinned by other adapters waits. The runner writes the slots the scheduler says were (re)assigned before the step
that first uses them (SchedulerOutput.lora_loads). Slot 0 is "no adapter" and is never handed out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from vllm_jax.lora.request import LoRARequest


@dataclass
class LoRASlots:
    """Slots 1..num_slots. `resident`: adapter id -> slot, least recently used first; `pins`: adapter id ->
    running requests using it."""

    num_slots: int
    resident: OrderedDict[int, int] = field(default_factory=OrderedDict)
    pins: dict[int, int] = field(default_factory=dict)
    _requests: dict[int, LoRARequest] = field(default_factory=dict)

    def can_acquire(self, lora: LoRARequest) -> bool:
        """Whether `acquire` would succeed now: the adapter is resident, a slot is empty, or one is unpinned."""
        if lora.lora_int_id in self.resident or len(self.resident) < self.num_slots:
            return True
        return any(not self.pins.get(adapter_id) for adapter_id in self.resident)

    def acquire(self, lora: LoRARequest) -> tuple[int, bool]:
        """Pin the adapter's slot for one more running request -> (slot, whether the slot must be (re)written).
        Raises RuntimeError when `can_acquire` is False (the caller checks first)."""
        adapter_id = lora.lora_int_id
        load = False
        if adapter_id not in self.resident:
            slot = self._free_slot()
            self.resident[adapter_id] = slot
            self._requests[adapter_id] = lora
            load = True
        self.resident.move_to_end(adapter_id)
        self.pins[adapter_id] = self.pins.get(adapter_id, 0) + 1
        return self.resident[adapter_id], load

    def release(self, lora: LoRARequest) -> None:
        """One running request of the adapter left (finished, aborted or preempted); its slot stays resident."""
        adapter_id = lora.lora_int_id
        count = self.pins.get(adapter_id, 0) - 1
        if count < 0:
            raise RuntimeError(f"LoRA adapter {lora.lora_name!r} released more often than acquired")
        if count:
            self.pins[adapter_id] = count
        else:
            self.pins.pop(adapter_id, None)

    def evict(self, adapter_id: int) -> bool:
        """Forget an unpinned resident adapter (unloading it); False if it is pinned or not resident."""
        if adapter_id not in self.resident or self.pins.get(adapter_id):
            return False
        del self.resident[adapter_id]
        self._requests.pop(adapter_id, None)
        return True

    @property
    def num_pinned(self) -> int:
        return len(self.pins)

    def _free_slot(self) -> int:
        used = set(self.resident.values())
        for slot in range(1, self.num_slots + 1):
            if slot not in used:
                return slot
        for adapter_id, slot in self.resident.items():  # least recently used first
            if not self.pins.get(adapter_id):
                del self.resident[adapter_id]
                self._requests.pop(adapter_id, None)
                return slot
        raise RuntimeError("every LoRA slot is pinned by a running request")
