"""Per-request block tables on top of the BlockPool, with prefix caching.

The scheduler asks two things: which leading blocks of a waiting request are already cached
(`get_computed_blocks`), and whether the blocks for this step's tokens can be had (`allocate_slots`,
all-or-nothing). Full blocks are registered in the prefix cache as soon as they are scheduled, so
another request in the same step can hit them. That relies on the runner writing each layer's KV for the
whole batch before that layer's attention reads the cache (vLLM makes the same assumption).
(docs/architecture/03-scheduler.md, "Scheduling")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from vllm_jax.paged_kv.block_hash import BlockHash, extend_block_hashes
from vllm_jax.paged_kv.block_pool import BlockPool, KVBlock
from vllm_jax.paged_kv.state_slots import StateSlots
from vllm_jax.utils import cdiv


class CacheRequest(Protocol):
    """What block accounting reads of a request (the scheduler's `Request` is one); paged_kv imports no
    scheduler code."""

    request_id: str
    cache_salt: str | None
    lora_int_id: int  # the LoRA adapter's id, 0 for none: a prefix-cache key like the salt
    num_computed_tokens: int
    block_hashes: list[BlockHash]  # extended in place as full blocks appear

    @property
    def num_tokens(self) -> int: ...

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def skip_reading_prefix_cache(self) -> bool: ...


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, max_model_len: int,
                 num_state_slots: int = 0) -> None:
        """`num_state_slots`: a hybrid model's state slots (the null slot included), handed out with a request's
        first blocks and taken back with them (paged_kv/state_slots.py); 0: none."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1; got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.state_slots = StateSlots(num_state_slots) if num_state_slots else None
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}  # per request: leading blocks already offered to the cache
        # Metrics (vLLM's prefix cache queries / hits, in tokens).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_usable_blocks(self) -> int:
        """Every block but the null block (block 0)."""
        return self.num_blocks - 1

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    def block_hashes(self, request: CacheRequest) -> list[BlockHash]:
        """The request's full-block hashes, extended to its current tokens."""
        return extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size,
                                   request.cache_salt, request.lora_int_id, getattr(request, "mm_spans", ()))

    def get_computed_blocks(self, request: CacheRequest) -> tuple[list[KVBlock], int]:
        """Longest chain of cached full blocks at the start of the request, and the tokens they hold.

        At most num_tokens - 1 tokens hit, so the last token is always computed (its logits are needed).
        Requests that skip reading the cache (prompt logprobs need every position's logits) get no hit.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        hashes = self.block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hit: list[KVBlock] = []
        for block_hash in hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hit.append(block)
        num_hit_tokens = len(hit) * self.block_size
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_hit_tokens
        return hit, num_hit_tokens

    def allocate_slots(self, request: CacheRequest, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVBlock] | None = None,
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        """Give the request slots for `num_new_tokens` more tokens after its computed (and hit) tokens, and for
        `num_lookahead_tokens` beyond them (a draft model writes its proposals' KV there after the step).

        Returns the ids of the newly allocated blocks (prefix-hit blocks not included), or None when the
        pool cannot supply them (cached-but-free blocks count as free); on None nothing changed.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0; got {num_new_tokens}")
        num_tokens = num_new_computed_tokens + num_new_tokens
        if not new_computed_blocks and self.fits_unchanged(request, num_tokens, num_lookahead_tokens):
            return []  # most decode steps: the tokens fit the last block and fill none, so nothing changes
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id, [])
        new_computed_blocks = new_computed_blocks or []
        if new_computed_blocks and req_blocks:
            raise ValueError(f"request {req_id} already holds blocks; prefix hits apply to fresh requests only")
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_slots = min(num_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        num_needed = self.num_blocks_for(num_slots) - len(req_blocks) - len(new_computed_blocks)
        # Hit blocks sitting in the free queue stop being free once touched.
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_needed > self.block_pool.num_free_blocks - num_evictable_hits:
            return None
        if self.state_slots is not None and self.state_slots.allocate(req_id) is None:
            return None  # every state slot held: the request waits as it would for blocks
        num_full, num_cached = 0, 0  # full blocks after this step, and those already registered in the cache
        if self.enable_caching:
            num_full = min(num_computed + num_new_tokens, request.num_tokens) // self.block_size
            num_cached = self._num_cached_blocks.get(req_id, 0)
        if num_needed <= 0 and not new_computed_blocks and num_full <= num_cached:
            return []

        self.block_pool.touch(new_computed_blocks)
        req_blocks = self.req_to_blocks.setdefault(req_id, [])
        req_blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(num_needed, 0))
        req_blocks.extend(new_blocks)
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(req_blocks, self.block_hashes(request), num_cached, num_full)
            self._num_cached_blocks[req_id] = num_full
        return [b.block_id for b in new_blocks]

    def fits_unchanged(self, request: CacheRequest, num_new_tokens: int, num_lookahead_tokens: int = 0) -> bool:
        """allocate_slots' fast path, where it would return [] at once (the scheduler asks first, per request per
        step, so plain ints): the tokens (after the computed ones) and the lookahead fit the blocks held, and no
        block fills up for the prefix cache."""
        size, end = self.block_size, request.num_computed_tokens + num_new_tokens
        num_slots = end + num_lookahead_tokens
        if num_slots > self.max_model_len:
            num_slots = self.max_model_len
        if (num_slots + size - 1) // size > len(self.req_to_blocks.get(request.request_id, ())):
            return False
        if not self.enable_caching:
            return True
        cached = self._num_cached_blocks.get(request.request_id, 0)
        # blocks full after this step: min(end, num_tokens) // size; end // size bounds it without the request's
        # token count, which only a block that may just have filled needs
        return end // size <= cached or min(end, request.num_tokens) // size <= cached

    def free(self, request: CacheRequest) -> None:
        """Release the request's blocks, tail first, so its last blocks are the first evicted.

        Call before resetting `num_computed_tokens`: blocks past it were registered in the cache this step
        but never computed (a same-step preemption), so they lose their hash instead of poisoning the cache.
        """
        req_id = request.request_id
        blocks = self.req_to_blocks.pop(req_id, [])
        self._num_cached_blocks.pop(req_id, None)
        if self.state_slots is not None:
            self.state_slots.free(req_id)
        first_uncomputed = request.num_computed_tokens // self.block_size
        for block in blocks[first_uncomputed:]:
            if block.ref_cnt == 1:
                self.block_pool.uncache_block(block)
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, req_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(req_id, [])]

    def state_slot(self, req_id: str) -> int:
        """The request's state slot (0: none, or a model without recurrent layers)."""
        return 0 if self.state_slots is None else self.state_slots.slot_of(req_id)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
