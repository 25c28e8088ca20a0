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
    assert kv.allocate_slots(a, 6) is not None and kv.state_slot("a") == 1
    assert kv.allocate_slots(b, 6) is not None and kv.state_slot("b") == 2
    free_blocks = kv.num_free_blocks
    assert kv.allocate_slots(c, 6) is None  # blocks enough, no state slot: nothing taken
    assert kv.num_free_blocks == free_blocks and kv.state_slot("c") == 0
    a.num_computed_tokens = 6
    assert kv.allocate_slots(a, 1) == [] and kv.state_slot("a") == 1  # later steps keep the slot
    kv.free(b)  # preemption or finish: the slot goes back with the blocks
    assert kv.state_slot("b") == 0
    assert kv.allocate_slots(c, 6) is not None and kv.state_slot("c") == 2


def test_a_model_without_states_has_no_slots():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=True, max_model_len=16)
    request = FakeRequest("a", [1, 2, 3])
    assert kv.allocate_slots(request, 3) is not None and kv.state_slot("a") == 0
