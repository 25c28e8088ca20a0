"""The physical KV blocks: ref counts, the free queue and the prefix-cache hash map.

Pure Python bookkeeping (no device memory): block ids index the device KV cache's block axis.

- Block 0 is the null block: padding tokens' slots point into it, so it is never handed out.
- A block with ref count 0 is free and sits in the free queue, whether or not it still holds cached KV.
  New blocks are popped from the queue's head; a popped block that was cached loses its hash then
  (lazy eviction). So freed unhashed blocks go to the front (reused first, nothing to lose) and freed
  hashed blocks go to the back (evicted last: LRU among cached blocks).
- The free queue is a doubly linked list through the blocks themselves, so a prefix hit can take a
  cached block out of the middle of the queue in O(1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vllm_jax.paged_kv.block_hash import BlockHash


@dataclass(eq=False)
class KVBlock:
    """One physical block. Identity equality: two blocks are the same only if they are the same object."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    # Free-queue links; both None exactly when the block is not in the free queue.
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)

    @property
    def is_null(self) -> bool:
        return self.block_id == 0


class FreeBlockQueue:
    """Doubly linked list of free blocks between two sentinels: O(1) popleft/append/appendleft/remove."""

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __contains__(self, block: KVBlock) -> bool:
        return block.prev_free is not None

    def popleft(self) -> KVBlock:
        block = self._head.next_free
        if block is self._tail:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVBlock) -> None:
        self._insert_after(self._tail.prev_free, block)

    def appendleft(self, block: KVBlock) -> None:
        self._insert_after(self._head, block)

    def _insert_after(self, prev: KVBlock, block: KVBlock) -> None:
        if block.prev_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        nxt = prev.next_free
        block.prev_free, block.next_free = prev, nxt
        prev.next_free = block
        nxt.prev_free = block
        self.num_free_blocks += 1

    def blocks(self) -> list[KVBlock]:
        """Free blocks from head (next to be reused) to tail. O(n): for tests and debugging."""
        out = []
        block = self._head.next_free
        while block is not self._tail:
            out.append(block)
            block = block.next_free
        return out


class BlockPool:
    """All KV blocks of one cache: allocation, ref counting, freeing and the hash -> block map."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the reserved null block); got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.free_block_queue = FreeBlockQueue(self.blocks[1:])
        # One block per hash: a second block computed with the same content stays unhashed (see cache_full_blocks).
        self.cached_blocks: dict[BlockHash, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, including those still holding evictable cached KV."""
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the usable (non-null) blocks held by requests."""
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Pop `n` blocks from the free queue head, evicting any cached KV they held. Ref count becomes 1."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot allocate {n} blocks: only {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            block = self.free_block_queue.popleft()
            assert block.ref_cnt == 0, f"free block {block.block_id} has ref count {block.ref_cnt}"
            self.uncache_block(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on blocks (prefix hits); blocks that were free leave the free queue."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: Iterable[KVBlock]) -> None:
        """Drop one reference on each block. Blocks reaching 0 become free: unhashed ones at the front,
        hashed ones at the back, in the given order (so the first given is evicted first)."""
        for block in blocks_in_eviction_order:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than it was taken (double free)")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_block_queue.appendleft(block)
                else:
                    self.free_block_queue.append(block)

    def cache_full_blocks(self, blocks: list[KVBlock], block_hashes: list[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] under block_hashes[same indices].

        Blocks already hashed (e.g. prefix hits) are left alone. When another block already holds a hash,
        the new one stays unhashed: one copy is enough, and the duplicate goes back to the free queue's front.
        """
        if not self.enable_caching:
            return
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is not None or block.is_null:
                continue
            block_hash = block_hashes[i]
            if block_hash in self.cached_blocks:
                continue
            block.block_hash = block_hash
            self.cached_blocks[block_hash] = block

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        if not self.enable_caching:
            return None
        return self.cached_blocks.get(block_hash)

    def uncache_block(self, block: KVBlock) -> None:
        """Forget the block's cached content (eviction, or KV that was never computed)."""
        if block.block_hash is None:
            return
        if self.cached_blocks.get(block.block_hash) is block:
            del self.cached_blocks[block.block_hash]
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash. Refused (False) while any block is in use: their KV would stay valid
        but unreachable, and callers expect a reset to mean a cold cache."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_blocks.clear()
        return True
