"""A hybrid model's state slots as the KV cache manager hands them out with a request's blocks
(docs/architecture/17-state-cache.md): each held request's live slot, and with prefix caching the snapshots at block
boundaries (paged_kv/state_snapshots.py), which slot a request's first step reads after a hit, and which slot a
step's end state is also written to."""

from __future__ import annotations

from vllm_jax.paged_kv.block_hash import BlockHash
from vllm_jax.paged_kv.state_slots import StateSlots
from vllm_jax.paged_kv.state_snapshots import StateSnapshots


class RecurrentStates:
    def __init__(self, num_slots: int, caching: bool) -> None:
        self.slots = StateSlots(num_slots)
        self.snapshots = StateSnapshots(self.slots) if caching else None
        self._sources: dict[str, int] = {}  # request -> the snapshot slot its step reads (a hit, this step)
        self._taken: dict[str, tuple[BlockHash | None, int, int]] = {}  # request -> (hash, slot, end) this step
        # request -> (block index, end token) of a snapshot written before its block's hash was known (async
        # scheduling: the block's last token was still being sampled); its slot is owned by ("pending", request)
        self._pending: dict[str, tuple[int, int]] = {}

    def begin_step(self) -> None:
        self._sources.clear()
        self._taken.clear()
        if self.snapshots is not None:
            self.snapshots.begin_step()

    def hit_blocks(self, block_hashes: list[BlockHash], num_hit_blocks: int) -> int:
        """How many of the leading cached blocks a hit may use: up to the last one whose end state is kept (none
        without prefix caching)."""
        if self.snapshots is None:
            return 0
        for n in range(num_hit_blocks, 0, -1):
            if self.snapshots.readable(block_hashes[n - 1]):
                return n
        return 0

    def acquire(self, req_id: str) -> bool:
        """The request's live slot (kept if it has one); snapshots give theirs up first. False: every slot is held
        by requests and by snapshots this step uses."""
        if self.slots.allocate(req_id) is not None:
            return True
        return (self.snapshots is not None and self.snapshots.make_room()
                and self.slots.allocate(req_id) is not None)

    def start_from(self, req_id: str, block_hash: BlockHash) -> None:
        """The request's first step starts from the snapshot after `block_hash` (its hit's last block)."""
        self._sources[req_id] = self.snapshots.read(block_hash)

    def snapshot(self, req_id: str, block_hash: BlockHash, end: int) -> None:
        """This step's computation of the request ends at token `end`, the end of the block `block_hash`: keep the
        state there too (unless kept already, or no slot can be had)."""
        if self.snapshots is None:
            return
        slot = self.snapshots.take(block_hash)
        if slot:
            self._taken[req_id] = (block_hash, slot, end)

    def snapshot_pending(self, req_id: str, block_index: int, end: int) -> None:
        """As `snapshot`, for a block whose last token is not known yet: the slot is kept for the request until the
        hash is (`bind`)."""
        if self.snapshots is None or req_id in self._pending:
            return
        owner = ("pending", req_id)
        slot = self.slots.allocate(owner)
        if slot is None and self.snapshots.make_room():
            slot = self.slots.allocate(owner)
        if slot is not None:
            self._pending[req_id] = (block_index, end)
            self._taken[req_id] = (None, slot, end)

    def bind(self, req_id: str, block_hashes: list[BlockHash]) -> None:
        """A pending snapshot of the request becomes its block's once the block's hash is known."""
        pending = self._pending.get(req_id)
        if pending is not None and pending[0] < len(block_hashes):
            del self._pending[req_id]
            self.snapshots.adopt(block_hashes[pending[0]], ("pending", req_id))

    def release(self, req_id: str, num_computed_tokens: int) -> None:
        """The request leaves (finished, aborted, preempted): its live slot goes back; a snapshot its step was to
        write past what it computed (preempted in the same step) is dropped."""
        self.slots.free(req_id)
        self._sources.pop(req_id, None)
        if self._pending.pop(req_id, None) is not None:
            self.slots.free(("pending", req_id))
        taken = self._taken.pop(req_id, None)
        if taken is not None and taken[0] is not None and num_computed_tokens < taken[2]:
            self.snapshots.drop(taken[0])

    def slot(self, req_id: str) -> int:
        return self.slots.slot_of(req_id)

    def source(self, req_id: str) -> int:
        """The slot the request's step reads its starting states from: a hit's snapshot, else its live slot."""
        return self._sources.get(req_id) or self.slots.slot_of(req_id)

    def snapshot_slot(self, req_id: str) -> int:
        """The slot the request's step also writes its end states to (0: none)."""
        taken = self._taken.get(req_id)
        return 0 if taken is None else taken[1]

    def clear_snapshots(self) -> None:
        if self.snapshots is not None:
            self.snapshots.clear()
