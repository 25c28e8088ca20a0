"""BlockPool / FreeBlockQueue / block hashes: the block accounting never loses or double-frees a block."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from vllm_jax.paged_kv.block_hash import block_extra_keys, extend_block_hashes, hash_block_tokens
from vllm_jax.paged_kv.block_pool import BlockPool, FreeBlockQueue, KVBlock


def _ids(blocks):
    return [b.block_id for b in blocks]


# ---- FreeBlockQueue ----------------------------------------------------------------------------------


def test_free_queue_supports_o1_remove_from_middle_and_both_ends():
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    q.appendleft(blocks[2])
    q.remove(blocks[4])
    q.append(blocks[4])
    assert _ids(q.blocks()) == [2, 0, 1, 3, 4]
    assert q.popleft() is blocks[2]
    assert len(q) == 4 and blocks[2] not in q and blocks[0] in q


def test_free_queue_rejects_double_insert_and_removing_absent_block():
    blocks = [KVBlock(i) for i in range(2)]
    q = FreeBlockQueue(blocks)
    with pytest.raises(ValueError):
        q.append(blocks[0])
    q.remove(blocks[0])
    with pytest.raises(ValueError):
        q.remove(blocks[0])
    assert q.popleft() is blocks[1]
    with pytest.raises(IndexError):
        q.popleft()


# ---- BlockPool -----------------------------------------------------------------------------------------


def test_null_block_is_never_handed_out():
    pool = BlockPool(5)
    got = pool.get_new_blocks(4)
    assert 0 not in _ids(got)
    assert pool.num_free_blocks == 0 and pool.usage == 1.0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_freed_unhashed_blocks_are_reused_first_and_hashed_blocks_last():
    pool = BlockPool(7)
    a = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, [b"h0", b"h1", b"h2"], 0, 2)  # a[0], a[1] hashed; a[2] not
    pool.free_blocks(reversed(a))
    order = _ids(pool.free_block_queue.blocks())
    # a[2] (unhashed) at the front, then the never-used blocks, then hashed tail-first: a[1] before a[0].
    assert order == [a[2].block_id, 4, 5, 6, a[1].block_id, a[0].block_id]


def test_reusing_a_cached_block_evicts_its_hash():
    pool = BlockPool(2)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([blk], [b"h"], 0, 1)
    pool.free_blocks([blk])
    assert pool.get_cached_block(b"h") is blk  # still cached while free
    (again,) = pool.get_new_blocks(1)
    assert again is blk and blk.block_hash is None and pool.get_cached_block(b"h") is None


def test_touch_takes_free_cached_block_out_of_free_queue():
    pool = BlockPool(4)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([blk], [b"h"], 0, 1)
    pool.free_blocks([blk])
    assert pool.num_free_blocks == 3
    pool.touch([blk])
    assert blk.ref_cnt == 1 and blk not in pool.free_block_queue and pool.num_free_blocks == 2
    pool.touch([blk])
    pool.free_blocks([blk])
    assert blk.ref_cnt == 1 and pool.num_free_blocks == 2  # still held by one owner


def test_double_free_raises():
    pool = BlockPool(3)
    (blk,) = pool.get_new_blocks(1)
    pool.free_blocks([blk])
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks([blk])


def test_duplicate_hash_keeps_first_block_and_leaves_second_unhashed():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [b"h"], 0, 1)
    pool.cache_full_blocks([b], [b"h"], 0, 1)
    assert pool.get_cached_block(b"h") is a and b.block_hash is None


def test_reset_prefix_cache_refused_while_blocks_in_use():
    pool = BlockPool(4)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([blk], [b"h"], 0, 1)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(b"h") is blk
    pool.free_blocks([blk])
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(b"h") is None and blk.block_hash is None


def test_caching_disabled_registers_nothing():
    pool = BlockPool(3, enable_caching=False)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([blk], [b"h"], 0, 1)
    assert blk.block_hash is None and pool.get_cached_block(b"h") is None


# ---- block hashes --------------------------------------------------------------------------------------


def test_block_hash_is_deterministic_and_chained_on_parent():
    h1 = hash_block_tokens(None, [1, 2, 3])
    assert h1 == hash_block_tokens(None, [1, 2, 3])
    assert hash_block_tokens(h1, [4, 5, 6]) != hash_block_tokens(None, [4, 5, 6])
    assert hash_block_tokens(None, [1, 2, 3], ("s",)) != h1
    assert hash_block_tokens(None, [1, 2, 3], ("s",)) != hash_block_tokens(None, [1, 2, 3], (b"s",))


def test_cache_salt_is_an_extra_key_of_the_first_block_only_but_changes_every_hash():
    assert block_extra_keys(0, "salt") == ("salt",)
    assert block_extra_keys(1, "salt") == ()
    tokens = list(range(12))
    plain = extend_block_hashes([], tokens, 4)
    salted = extend_block_hashes([], tokens, 4, "salt")
    assert len(plain) == 3 and all(p != s for p, s in zip(plain, salted))


def test_extend_block_hashes_only_hashes_full_blocks_and_is_incremental():
    hashes = extend_block_hashes([], list(range(7)), 4)
    assert len(hashes) == 1
    extend_block_hashes(hashes, list(range(9)), 4)
    assert hashes == extend_block_hashes([], list(range(9)), 4)


# ---- random operations never lose or double-free a block ---------------------------------------------


class BlockPoolMachine(RuleBasedStateMachine):
    """Owners model requests: each holds a list of block references (a block may be shared via touch)."""

    @initialize(num_blocks=st.integers(2, 12))
    def setup(self, num_blocks):
        self.pool = BlockPool(num_blocks)
        self.owners: list[list[KVBlock]] = []

    @rule(n=st.integers(0, 6))
    def allocate(self, n):
        if n > self.pool.num_free_blocks:
            before = self.pool.num_free_blocks
            with pytest.raises(ValueError):
                self.pool.get_new_blocks(n)
            assert self.pool.num_free_blocks == before
            return
        blocks = self.pool.get_new_blocks(n)
        assert all(b.ref_cnt == 1 for b in blocks)
        self.owners.append(blocks)

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def free_owner(self, data):
        idx = data.draw(st.integers(0, len(self.owners) - 1))
        self.pool.free_blocks(reversed(self.owners.pop(idx)))

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def cache_owner_blocks(self, data):
        owner = data.draw(st.sampled_from(self.owners))
        hashes = [data.draw(st.sampled_from([b"a", b"b", b"c", b"d", b"e"])) for _ in owner]
        self.pool.cache_full_blocks(owner, hashes, 0, len(owner))

    @rule(h=st.sampled_from([b"a", b"b", b"c", b"d", b"e"]))
    def prefix_hit(self, h):
        block = self.pool.get_cached_block(h)
        if block is not None:
            self.pool.touch([block])
            self.owners.append([block])

    @rule()
    def reset(self):
        assert self.pool.reset_prefix_cache() == (not any(self.owners))

    @rule(data=st.data())
    def double_free_is_rejected(self, data):
        free = self.pool.free_block_queue.blocks()
        if not free:
            return
        block = data.draw(st.sampled_from(free))
        with pytest.raises(ValueError):
            self.pool.free_blocks([block])

    @invariant()
    def accounting_is_exact(self):
        pool = self.pool
        expected = {}
        for owner in self.owners:
            for b in owner:
                expected[b.block_id] = expected.get(b.block_id, 0) + 1
        assert 0 not in expected
        for b in pool.blocks:
            assert b.ref_cnt == expected.get(b.block_id, 0)
        in_use = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
        assert pool.num_free_blocks + in_use == pool.num_blocks - 1
        free = pool.free_block_queue.blocks()
        assert len(free) == pool.num_free_blocks == len({b.block_id for b in free})
        assert {b.block_id for b in free} == {b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0}
        assert pool.null_block.ref_cnt == 0 and pool.null_block not in pool.free_block_queue

    @invariant()
    def hash_map_matches_blocks(self):
        for h, b in self.pool.cached_blocks.items():
            assert b.block_hash == h
        hashed = [b for b in self.pool.blocks if b.block_hash is not None]
        assert len(hashed) == len(self.pool.cached_blocks)


BlockPoolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestBlockPoolNeverLosesOrDoubleFreesABlock = BlockPoolMachine.TestCase
