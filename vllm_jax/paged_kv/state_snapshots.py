"""Prefix caching for hybrid models: the state at the end of a cached block, kept in a state slot of its own
(docs/architecture/17-state-cache.md, "Prefix caching for hybrid models").

A prefix hit skips the hit tokens' computation; a recurrent layer then needs the state those tokens leave behind.
A snapshot is that state for one block hash (the state after every token up to the block's end: the hash chain
names the whole prefix, so it stays valid as long as it is kept). Snapshots are taken when a step's computation
ends on a block boundary (the scheduler aligns prompt chunks to them) and are evicted least recently used, never
while a step reads or writes them. A snapshot taken this step is read from the next step on: the step's states are
written at its end."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from vllm_jax.paged_kv.block_hash import BlockHash
from vllm_jax.paged_kv.state_slots import StateSlots


class StateSnapshots:
    """Block hash -> the state slot holding the state after that block, LRU; slots come from the live requests'
    pool (`slots`), which takes them back first when a request needs one (`make_room`)."""

    def __init__(self, slots: StateSlots) -> None:
        self._slots = slots
        self._by_hash: OrderedDict[BlockHash, int] = OrderedDict()
        self._pinned: set[int] = set()  # slots this step reads or writes
        self._fresh: set[BlockHash] = set()  # taken this step: readable from the next one

    def __len__(self) -> int:
        return len(self._by_hash)

    def begin_step(self) -> None:
        self._pinned.clear()
        self._fresh.clear()

    def readable(self, block_hash: BlockHash) -> bool:
        return block_hash in self._by_hash and block_hash not in self._fresh

    def read(self, block_hash: BlockHash) -> int:
        """The snapshot's slot, which this step reads (kept from eviction until the next step)."""
        slot = self._by_hash[block_hash]
        self._by_hash.move_to_end(block_hash)
        self._pinned.add(slot)
        return slot

    def take(self, block_hash: BlockHash) -> int:
        """A slot for a new snapshot of `block_hash`, written this step; 0 (none) when it has one already or every
        slot is held by requests and pinned snapshots."""
        if block_hash in self._by_hash:
            return 0
        slot = self._slots.allocate(("snapshot", block_hash))
        if slot is None:
            if not self.make_room():
                return 0
            slot = self._slots.allocate(("snapshot", block_hash))
        self._by_hash[block_hash] = slot
        self._pinned.add(slot)
        self._fresh.add(block_hash)
        return slot

    def adopt(self, block_hash: BlockHash, owner: Hashable) -> None:
        """Keep the state already in `owner`'s slot as the snapshot of `block_hash` (a step wrote it before the
        block's last token was known: async scheduling); the slot is freed when `block_hash` has one already."""
        if block_hash in self._by_hash:
            self._slots.free(owner)
        else:
            self._by_hash[block_hash] = self._slots.transfer(owner, ("snapshot", block_hash))

    def make_room(self) -> bool:
        """Evict the least recently used snapshot no step reads or writes now; False when there is none."""
        for block_hash, slot in self._by_hash.items():
            if slot not in self._pinned:
                self.drop(block_hash)
                return True
        return False

    def drop(self, block_hash: BlockHash) -> None:
        """Forget a snapshot (evicted, or never computed: its step's request was preempted in the same step)."""
        if self._by_hash.pop(block_hash, None) is not None:
            self._slots.free(("snapshot", block_hash))
            self._fresh.discard(block_hash)

    def clear(self) -> None:
        for block_hash in list(self._by_hash):
            self.drop(block_hash)
