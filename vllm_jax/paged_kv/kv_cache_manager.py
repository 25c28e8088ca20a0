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
from vllm_jax.paged_kv.recurrent_states import RecurrentStates
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
        first blocks and taken back with them, and with prefix caching its snapshots at block boundaries
        (paged_kv/recurrent_states.py); 0: none."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1; got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.states = RecurrentStates(num_state_slots, enable_caching) if num_state_slots else None
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
        if self.states is not None:  # a hybrid model's hit ends where a block's end state is kept
            hit = hit[:self.states.hit_blocks(hashes, len(hit))]
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
        if self.states is not None:
            if new_computed_blocks:  # read first: taking a live slot may evict an unread snapshot
                self.states.start_from(req_id, self.block_hashes(request)[len(new_computed_blocks) - 1])
            if not self.states.acquire(req_id):
                return None  # every state slot held: the request waits as it would for blocks
        num_full, num_cached = 0, 0  # full blocks after this step, and those already registered in the cache
        if self.enable_caching:
            num_full = min(num_computed + num_new_tokens, request.num_tokens) // self.block_size
            num_cached = self._num_cached_blocks.get(req_id, 0)
        keeps_state = (self.states is not None and self.enable_caching
                       and (num_computed + num_new_tokens) % self.block_size == 0)
        if num_needed <= 0 and not new_computed_blocks and num_full <= num_cached and not keeps_state:
            return []

        self.block_pool.touch(new_computed_blocks)
        req_blocks = self.req_to_blocks.setdefault(req_id, [])
        req_blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(num_needed, 0))
        req_blocks.extend(new_blocks)
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(req_blocks, self.block_hashes(request), num_cached, num_full)
            self._num_cached_blocks[req_id] = num_full
        if self.states is not None and self.enable_caching:  # a boundary, or a block just registered (`bind`)
            self._keep_states(request, num_computed + num_new_tokens)
        return [b.block_id for b in new_blocks]

    def _keep_states(self, request: CacheRequest, end: int) -> None:
        """A hybrid model's step ending on a block boundary keeps the state there (docs/architecture/
        17-state-cache.md, "Prefix caching for hybrid models")."""
        hashes, req_id = self.block_hashes(request), request.request_id
        self.states.bind(req_id, hashes)
        if end % self.block_size == 0 and end > 0:
            index = end // self.block_size - 1
            if index < len(hashes):
                self.states.snapshot(req_id, hashes[index], end)
            else:  # async scheduling: the block's last token is still being sampled
                self.states.snapshot_pending(req_id, index, end)

    def aligned_chunk(self, num_computed: int, num_new: int) -> int:
        """A hybrid model with prefix caching: the tokens to compute this step cut to end on the last block
        boundary they cross, so the step's end state can be kept there (the rest runs next step)."""
        if self.states is None or not self.enable_caching:
            return num_new
        boundary = (num_computed + num_new) // self.block_size * self.block_size
        return boundary - num_computed if num_computed < boundary < num_computed + num_new else num_new

    def begin_step(self) -> None:
        """A new step is being scheduled: the last step's state reads and writes are done with."""
        if self.states is not None:
            self.states.begin_step()

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
        if self.states is not None and end % size == 0:
            return False  # a hybrid model's step ending on a block boundary keeps its state (_keep_states)
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
        if self.states is not None:
            self.states.release(req_id, request.num_computed_tokens)
        first_uncomputed = request.num_computed_tokens // self.block_size
        for block in blocks[first_uncomputed:]:
            if block.ref_cnt == 1:
                self.block_pool.uncache_block(block)
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, req_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(req_id, [])]

    def state_slots_of(self, req_id: str) -> tuple[int, int, int]:
        """A hybrid model's slots for the request's step: (its live slot, the slot its step reads, the snapshot slot
        its step also writes); zeros for a model without recurrent layers."""
        states = self.states
        if states is None:
            return 0, 0, 0
        return states.slot(req_id), states.source(req_id), states.snapshot_slot(req_id)

    def reset_prefix_cache(self) -> bool:
        reset = self.block_pool.reset_prefix_cache()
        if reset and self.states is not None:
            self.states.clear_snapshots()
        return reset
