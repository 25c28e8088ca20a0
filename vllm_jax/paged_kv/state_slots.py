"""The state slots of a hybrid model's recurrent layers: one per request the scheduler holds, handed out and taken
back with the request's KV blocks (docs/architecture/17-state-cache.md, "The state cache"). Pure Python: the
device's pool is indexed by these numbers."""

from __future__ import annotations


class StateSlots:
    """Slots 1..num_slots-1 (0 is the null slot padding rows write); the lowest free slot first."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError(f"a state pool needs the null slot and at least one more; got {num_slots} slots")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, 0, -1))
        self._slot_of: dict[str, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def slot_of(self, req_id: str) -> int:
        """The request's slot (0 when it holds none)."""
        return self._slot_of.get(req_id, 0)

    def allocate(self, req_id: str) -> int | None:
        """The request's slot, taken now if it holds none; None when every slot is held."""
        slot = self._slot_of.get(req_id)
        if slot is not None:
            return slot
        if not self._free:
            return None
        slot = self._slot_of[req_id] = self._free.pop()
        return slot

    def free(self, req_id: str) -> None:
        slot = self._slot_of.pop(req_id, None)
        if slot is not None:
            self._free.append(slot)
