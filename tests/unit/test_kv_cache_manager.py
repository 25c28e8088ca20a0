"""KVCacheManager: prefix hits, their caps and salts, eviction order, counters, all-or-nothing allocation."""

from dataclasses import dataclass, field

from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.request import Request

BS = 4


def make_request(req_id, tokens, salt=None, prompt_logprobs=None):
    return Request(request_id=req_id, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=4, prompt_logprobs=prompt_logprobs),
                   eos_token_id=None, arrival_time=0.0, seed=0, cache_salt=salt)


def run_prefill(kv, req):
    """Schedule the whole prompt (with any prefix hit), as the scheduler does, and mark it computed."""
    hit_blocks, num_hit = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit_blocks)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    return hit_blocks, num_hit


def test_second_request_with_same_prefix_hits_cached_full_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(14))  # 3 full blocks + 2 tokens
    run_prefill(kv, a)
    a_blocks = kv.get_block_ids("a")
    kv.free(a)
    b = make_request("b", list(range(12)) + [99, 98, 97])
    hit_blocks, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 12
    assert [blk.block_id for blk in hit_blocks] == a_blocks[:3]


def test_hit_blocks_are_shared_not_copied():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(9))
    run_prefill(kv, a)
    b = make_request("b", range(9))
    _, num_hit = run_prefill(kv, b)
    assert num_hit == 8
    assert kv.get_block_ids("a")[:2] == kv.get_block_ids("b")[:2]
    assert kv.get_block_ids("a")[2] != kv.get_block_ids("b")[2]
    assert kv.num_free_blocks == 15 - 4


def test_hit_is_capped_at_num_tokens_minus_one():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=True, max_model_len=64)
    run_prefill(kv, make_request("a", range(8)))  # exactly 2 full blocks
    _, num_hit = kv.get_computed_blocks(make_request("b", range(8)))
    assert num_hit == 4  # the last block is dropped so one token is computed
    _, num_hit = kv.get_computed_blocks(make_request("c", range(9)))
    assert num_hit == 8


def test_cache_salt_separates_requests_with_equal_tokens():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=True, max_model_len=64)
    run_prefill(kv, make_request("a", range(9), salt="tenant-1"))
    assert kv.get_computed_blocks(make_request("b", range(9), salt="tenant-2"))[1] == 0
    assert kv.get_computed_blocks(make_request("c", range(9)))[1] == 0
    assert kv.get_computed_blocks(make_request("d", range(9), salt="tenant-1"))[1] == 8


def test_hit_requires_the_whole_prefix_to_match():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=True, max_model_len=64)
    run_prefill(kv, make_request("a", range(9)))
    other_first_block = [100, 101, 102, 103] + list(range(4, 9))
    assert kv.get_computed_blocks(make_request("b", other_first_block))[1] == 0


def test_counters_count_queried_and_hit_tokens():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=True, max_model_len=64)
    run_prefill(kv, make_request("a", range(9)))
    run_prefill(kv, make_request("b", range(10)))
    assert kv.prefix_cache_queries == 19
    assert kv.prefix_cache_hits == 8


def test_no_hits_and_no_counting_when_caching_disabled():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=False, max_model_len=64)
    run_prefill(kv, make_request("a", range(9)))
    assert kv.get_computed_blocks(make_request("b", range(9))) == ([], 0)
    assert kv.prefix_cache_queries == 0 and kv.prefix_cache_hits == 0


def test_prompt_logprobs_request_skips_the_prefix_cache():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=True, max_model_len=64)
    run_prefill(kv, make_request("a", range(9)))
    assert kv.get_computed_blocks(make_request("b", range(9), prompt_logprobs=1))[1] == 0


def test_cached_blocks_are_evicted_lru_across_requests():
    kv = KVCacheManager(num_blocks=5, block_size=BS, enable_caching=True, max_model_len=64)
    a, b = make_request("a", range(5)), make_request("b", range(50, 55))
    run_prefill(kv, a)
    run_prefill(kv, b)
    kv.free(a)  # a's cached block becomes free first: least recently used
    kv.free(b)
    run_prefill(kv, make_request("c", range(200, 207)))  # 2 blocks: the 2 unhashed, no eviction
    run_prefill(kv, make_request("d", range(300, 303)))  # 1 block: must evict a's cached block
    assert kv.get_computed_blocks(make_request("a2", range(5)))[1] == 0
    assert kv.get_computed_blocks(make_request("b2", range(50, 55)))[1] == 4


def test_freeing_evicts_a_requests_tail_blocks_before_its_head():
    kv = KVCacheManager(num_blocks=5, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(13))  # 3 full blocks + 1 partial = all 4 blocks
    run_prefill(kv, a)
    kv.free(a)
    run_prefill(kv, make_request("x", range(500, 507)))  # 2 blocks: the partial one, then a's 3rd block
    _, num_hit = kv.get_computed_blocks(make_request("a2", range(13)))
    assert num_hit == 8  # the first two blocks survived


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(8))
    run_prefill(kv, a)
    b = make_request("b", range(100, 108))
    assert kv.allocate_slots(b, 8) is None
    assert kv.num_free_blocks == 1 and kv.get_block_ids("b") == []
    assert kv.allocate_slots(b, 4) is not None


def test_free_cached_hit_blocks_count_as_free_but_are_not_double_counted():
    kv = KVCacheManager(num_blocks=4, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(9))
    run_prefill(kv, a)  # 3 blocks, 2 cached
    kv.free(a)
    b = make_request("b", range(13))  # hits 2 blocks; needs 2 more, only 1 free once the hits are taken
    hit_blocks, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    assert kv.allocate_slots(b, 5, num_hit, hit_blocks) is None
    assert kv.num_free_blocks == 3
    c = make_request("c", range(11))  # hits 2 blocks; needs 1 more: fits
    hit_blocks, num_hit = kv.get_computed_blocks(c)
    assert kv.allocate_slots(c, 3, num_hit, hit_blocks) is not None and kv.num_free_blocks == 0


def test_allocate_slots_returns_only_new_block_ids_and_grows_by_decode():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(4))
    first = kv.allocate_slots(a, 4)
    a.num_computed_tokens = 4
    a.append_output_token_ids(7)
    second = kv.allocate_slots(a, 1)
    assert len(first) == 1 and len(second) == 1 and kv.get_block_ids("a") == first + second
    a.num_computed_tokens = 5
    a.append_output_token_ids(8)
    assert kv.allocate_slots(a, 1) == []  # room left in the second block


def test_blocks_scheduled_but_never_computed_leave_the_cache_when_freed():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(9))
    assert kv.allocate_slots(a, 9) is not None  # registered in the cache as scheduled...
    kv.free(a)  # ...but preempted before its step ran (num_computed_tokens still 0)
    assert kv.get_computed_blocks(make_request("b", range(9)))[1] == 0
    assert kv.num_free_blocks == 7


def test_usage_reports_fraction_of_non_null_blocks_in_use():
    kv = KVCacheManager(num_blocks=5, block_size=BS, enable_caching=True, max_model_len=64)
    run_prefill(kv, make_request("a", range(5)))
    assert kv.usage == 0.5


def test_reset_prefix_cache_only_when_idle():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_caching=True, max_model_len=64)
    a = make_request("a", range(9))
    run_prefill(kv, a)
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert kv.get_computed_blocks(make_request("b", range(9)))[1] == 0


@dataclass
class _BareRequest:
    """Only the fields of CacheRequest: block accounting needs nothing else of the scheduler's Request."""

    request_id: str
    all_token_ids: list[int]
    cache_salt: str | None = None
    lora_int_id: int = 0
    num_computed_tokens: int = 0
    skip_reading_prefix_cache: bool = False
    block_hashes: list = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def test_any_object_with_the_cache_request_fields_shares_prefixes_with_a_scheduler_request():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_caching=True, max_model_len=64)
    run_prefill(kv, _BareRequest("bare", list(range(9))))
    assert kv.get_computed_blocks(make_request("b", range(9)))[1] == 8
    assert kv.get_computed_blocks(_BareRequest("skips", list(range(9)), skip_reading_prefix_cache=True))[1] == 0
