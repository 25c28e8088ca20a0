"""The state slots of a hybrid model's recurrent layers: one per request the scheduler holds, handed out and taken
back with the request's KV blocks (docs/architecture/17-state-cache.md, "The state cache"). Pure Python: the
device's pool is indexed by these numbers."""

from __future__ import annotations

from collections.abc import Hashable


class StateSlots:
    """Slots 1..num_slots-1 (0 is the null slot padding rows write); the lowest free slot first."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError(f"a state pool needs the null slot and at least one more; got {num_slots} slots")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, 0, -1))
        self._slot_of: dict[Hashable, int] = {}  # owner (a request id, or a snapshot's key) -> slot

    @property
    def num_free(self) -> int:
        return len(self._free)

    def slot_of(self, owner: Hashable) -> int:
        """The owner's slot (0 when it holds none)."""
        return self._slot_of.get(owner, 0)

    def allocate(self, owner: Hashable) -> int | None:
        """The owner's slot, taken now if it holds none; None when every slot is held."""
        slot = self._slot_of.get(owner)
        if slot is not None:
            return slot
        if not self._free:
            return None
        slot = self._slot_of[owner] = self._free.pop()
        return slot

    def transfer(self, owner: Hashable, new_owner: Hashable) -> int:
        """Hand the owner's slot to `new_owner` (who holds none); returns it."""
        slot = self._slot_of[new_owner] = self._slot_of.pop(owner)
        return slot

    def free(self, owner: Hashable) -> None:
        slot = self._slot_of.pop(owner, None)
        if slot is not None:
            self._free.append(slot)
