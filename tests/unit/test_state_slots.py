"""State slots of hybrid models (paged_kv/state_slots.py) handed out and taken back with a request's KV blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
from vllm_jax.paged_kv.state_slots import StateSlots


@dataclass
class FakeRequest:
    request_id: str
    tokens: list[int]
    cache_salt: str | None = None
    lora_int_id: int = 0
    num_computed_tokens: int = 0
    block_hashes: list = field(default_factory=list)
    skip_reading_prefix_cache: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def all_token_ids(self) -> list[int]:
        return self.tokens


def test_slots_lowest_first_reused_after_free_and_exhaustible():
    slots = StateSlots(3)
    assert slots.allocate("a") == 1 and slots.allocate("b") == 2
    assert slots.allocate("a") == 1  # a request keeps its slot
    assert slots.allocate("c") is None  # the null slot is never handed out
    slots.free("a")
    assert slots.slot_of("a") == 0 and slots.allocate("c") == 1
    with pytest.raises(ValueError):
        StateSlots(1)


def test_the_kv_manager_gives_a_slot_with_the_first_blocks_and_takes_it_back_on_free():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_caching=False, max_model_len=32, num_state_slots=3)
    a, b, c = (FakeRequest(name, list(range(6))) for name in "abc")
    assert kv.allocate_slots(a, 6) is not None and kv.state_slots_of("a")[0] == 1
    assert kv.allocate_slots(b, 6) is not None and kv.state_slots_of("b")[0] == 2
    free_blocks = kv.num_free_blocks
    assert kv.allocate_slots(c, 6) is None  # blocks enough, no state slot: nothing taken
    assert kv.num_free_blocks == free_blocks and kv.state_slots_of("c")[0] == 0
    a.num_computed_tokens = 6
    assert kv.allocate_slots(a, 1) == [] and kv.state_slots_of("a")[0] == 1  # later steps keep the slot
    kv.free(b)  # preemption or finish: the slot goes back with the blocks
    assert kv.state_slots_of("b")[0] == 0
    assert kv.allocate_slots(c, 6) is not None and kv.state_slots_of("c")[0] == 2


def test_a_model_without_states_has_no_slots():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=True, max_model_len=16)
    request = FakeRequest("a", [1, 2, 3])
    assert kv.allocate_slots(request, 3) is not None and kv.state_slots_of("a")[0] == 0


def test_hybrid_prefix_hits_end_at_a_kept_snapshot_and_read_it():
    """A step ending on a block boundary keeps the state there; a later request with the same prefix hits up to
    that block only, reads the snapshot's slot in its first step, and a snapshot taken this step is not readable
    before the next one."""
    kv = KVCacheManager(num_blocks=32, block_size=4, enable_caching=True, max_model_len=64, num_state_slots=5)
    prompt = list(range(10, 21))  # 11 tokens: blocks [0, 4) [4, 8) full, 3 tokens past
    a = FakeRequest("a", prompt)
    kv.begin_step()
    assert kv.aligned_chunk(0, 11) == 8  # the chunk ends on the last boundary it crosses
    assert kv.allocate_slots(a, 8) is not None
    live, read, snapshot = kv.state_slots_of("a")
    assert live and read == live and snapshot not in (0, live)
    same = FakeRequest("b", prompt)
    assert kv.get_computed_blocks(same) == ([], 0)  # taken this step: not readable yet
    kv.begin_step()
    a.num_computed_tokens = 8
    blocks, hit = kv.get_computed_blocks(same)
    assert hit == 8 and len(blocks) == 2  # both blocks, ending where the snapshot was kept
    assert kv.allocate_slots(same, 3, hit, blocks) is not None
    b_live, b_read, _ = kv.state_slots_of("b")
    assert b_read == snapshot and b_live not in (0, live, snapshot)


def test_a_snapshot_of_a_step_preempted_before_it_ran_is_dropped_and_requests_evict_snapshots():
    kv = KVCacheManager(num_blocks=32, block_size=4, enable_caching=True, max_model_len=64, num_state_slots=3)
    a = FakeRequest("a", list(range(10, 18)))
    kv.begin_step()
    assert kv.allocate_slots(a, 8) is not None and kv.state_slots_of("a")[2]  # a live slot and a snapshot
    kv.free(a)  # preempted in the same step: its 8 tokens were never computed
    kv.begin_step()
    assert kv.get_computed_blocks(FakeRequest("b", list(range(10, 18)) + [1])) == ([], 0)
    c = FakeRequest("c", list(range(30, 38)))
    assert kv.allocate_slots(c, 8) is not None
    c_snapshot = kv.state_slots_of("c")[2]
    assert c_snapshot and kv.state_slots_of("c")[0] not in (0, c_snapshot)  # both slots held
    c.num_computed_tokens = 8
    kv.begin_step()
    d = FakeRequest("d", [5, 6])
    assert kv.allocate_slots(d, 2) is not None  # no free slot: the snapshot gives its slot up
    assert kv.state_slots_of("d")[0] == c_snapshot
    assert kv.get_computed_blocks(FakeRequest("e", list(range(30, 38)) + [1])) == ([], 0)
