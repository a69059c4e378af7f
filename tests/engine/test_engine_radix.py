"""RadixCache: focused unit tests of match / insert / split / lock / evict / integrity (the
state machine against a naive model is `test_engine_radix_machine.py`)."""

import pytest
import torch

from corral.engine.kvcache.kv_pool import KVIntegrityError, KVPool
from corral.engine.kvcache.radix_cache import RadixCache


def _cache(num_slots: int = 64) -> tuple[KVPool, RadixCache]:
    pool = KVPool(1, 1, 2, num_slots=num_slots)
    return pool, RadixCache(pool)


def _put(pool: KVPool, cache: RadixCache, ids: list[int]) -> torch.Tensor:
    """Insert `ids` with freshly allocated slots; return those slots."""
    slots = pool.alloc(len(ids))
    cache.insert(ids, slots)
    return slots


def test_empty_cache_matches_nothing() -> None:
    pool, cache = _cache()
    idx, match = cache.match_prefix([1, 2, 3])
    assert idx.numel() == 0 and idx.dtype == torch.int64
    assert match.node is cache.root
    node = cache.lock(match)  # locking the root is a harmless no-op
    assert node is cache.root
    cache.unlock(node)
    assert cache.total_size == 0
    cache.check_integrity(held=[])


def test_match_returns_slots_of_longest_prefix() -> None:
    pool, cache = _cache()
    slots = _put(pool, cache, [5, 6, 7, 8])
    for query, n in [([5, 6, 7, 8], 4), ([5, 6, 7, 8, 9], 4), ([5, 6, 1], 2), ([6], 0), ([], 0)]:
        idx, _ = cache.match_prefix(query)
        assert idx.tolist() == slots[:n].tolist(), query
    cache.check_integrity(held=[])


def test_match_inside_an_edge_changes_nothing_and_lock_pins_exactly_the_prefix() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3, 4, 5])
    before = _shape(cache)
    _, match = cache.match_prefix([1, 2, 9])
    assert _shape(cache) == before  # a pure query: no split, no clock moved
    assert (match.node.key, match.inside) == ((1, 2, 3, 4, 5), 2)
    node = cache.lock(match)  # the split happens here
    assert node.key == (1, 2)
    assert (cache.protected_size, cache.evictable_size) == (2, 3)
    assert cache.evict(100) == 3  # only the unlocked tail [3, 4, 5] can go
    idx, _ = cache.match_prefix([1, 2, 3])
    assert idx.numel() == 2
    cache.unlock(node)
    cache.check_integrity(held=[])


def test_insert_returns_cached_count_and_frees_only_the_duplicates() -> None:
    pool, cache = _cache()
    first = _put(pool, cache, [1, 2, 3])
    prefix, match = cache.match_prefix([1, 2, 3, 4, 5])
    node = cache.lock(match)
    fresh = pool.alloc(2)
    free_before = pool.num_free
    # The caller passes the tree's own slots for [1,2,3]: none of them may be freed.
    assert cache.insert([1, 2, 3, 4, 5], torch.cat([prefix, fresh])) == 3
    assert pool.num_free == free_before
    cache.unlock(node)
    # A second writer computed [1,2,3,4] into its own slots: all 4 are duplicates.
    other = pool.alloc(4)
    assert cache.insert([1, 2, 3, 4], other) == 4
    assert pool.is_free(other).all()
    assert pool.num_free == free_before
    idx, _ = cache.match_prefix([1, 2, 3, 4, 5])
    assert idx.tolist() == first.tolist() + fresh.tolist()
    cache.check_integrity(held=[])


def test_running_request_can_hand_its_kv_over_and_keep_reading_it() -> None:
    """Chunked prefill: cache the first chunk, then re-match and lock to keep its slots."""
    pool, cache = _cache()
    old = cache.lock(cache.match_prefix([1, 2, 3, 4])[1])
    chunk = pool.alloc(4)
    cache.insert([1, 2, 3, 4], chunk)  # the tree owns `chunk` now
    idx, match = cache.match_prefix([1, 2, 3, 4])
    node = cache.lock(match)
    cache.unlock(old)
    assert idx.tolist() == chunk.tolist()
    assert cache.evict(100) == 0  # still pinned by the running request
    cache.check_integrity(held=[])
    cache.unlock(node)
    assert cache.evict(100) == 4
    cache.check_integrity(held=[])


def test_insert_that_diverges_mid_edge_splits() -> None:
    pool, cache = _cache()
    a = _put(pool, cache, [1, 2, 3, 4])
    b = pool.alloc(4)
    assert cache.insert([1, 2, 7, 8], b) == 2
    assert pool.is_free(b[:2]).all() and not pool.is_free(b[2:]).any()
    assert cache.match_prefix([1, 2, 7, 8])[0].tolist() == a[:2].tolist() + b[2:].tolist()
    assert cache.match_prefix([1, 2, 3, 4])[0].tolist() == a.tolist()
    assert cache.total_size == 6
    cache.check_integrity(held=[])


def test_insert_rejects_mismatched_lengths() -> None:
    pool, cache = _cache()
    with pytest.raises(ValueError, match="one pool slot per token"):
        cache.insert([1, 2, 3], pool.alloc(2))


def test_token_ids_may_be_a_tensor() -> None:
    pool, cache = _cache()
    slots = _put(pool, cache, [3, 1, 4])
    idx, _ = cache.match_prefix(torch.tensor([3, 1, 4, 1]))
    assert idx.tolist() == slots.tolist()


def test_evict_is_lru_over_leaves() -> None:
    pool, cache = _cache()
    a = _put(pool, cache, [1, 1, 1])
    b = _put(pool, cache, [2, 2, 2])
    cache.match_prefix([2, 2, 2])  # only looked at: b stays the least recently used
    cache.unlock(cache.lock(cache.match_prefix([1, 1, 1, 5])[1]))  # a is used: now the newer
    assert cache.evict(1) == 3  # the whole least recently used leaf goes
    assert pool.is_free(b).all() and not pool.is_free(a).any()
    assert cache.match_prefix([2])[0].numel() == 0
    cache.unlock(cache.lock(cache.match_prefix([1, 1])[1]))  # splits a; its tail is the oldest
    assert cache.evict(1) == 1
    assert cache.match_prefix([1, 1, 1])[0].tolist() == a[:2].tolist()
    cache.check_integrity(held=[])


def test_evict_cascades_to_parents_that_become_leaves() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3])
    _put(pool, cache, [1, 2, 4])  # tree: [1,2] -> {[3], [4]}
    _put(pool, cache, [9])
    cache.unlock(cache.lock(cache.match_prefix([9])[1]))  # [9] most recent
    assert cache.evict(4) == 4  # [3], [4], then their parent [1,2]
    assert cache.total_size == 1
    assert cache.match_prefix([9])[0].numel() == 1
    cache.check_integrity(held=[])


def test_locked_paths_survive_eviction() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3])
    _put(pool, cache, [4, 5])
    idx, match = cache.match_prefix([1, 2, 3])
    node = cache.lock(match)
    assert cache.lock(match) is node  # two users of the same prefix
    assert cache.evict(100) == 2
    cache.unlock(node)
    assert cache.evict(100) == 0  # still locked once
    cache.unlock(node)
    assert cache.evictable_size == 3
    assert cache.evict(1) == 3
    assert pool.is_free(idx).all()
    cache.check_integrity(held=[])


def test_lock_handle_stays_valid_across_a_split_above_it() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3, 4])
    node = cache.lock(cache.match_prefix([1, 2, 3, 4])[1])
    mid = cache.lock(cache.match_prefix([1, 2])[1])  # splits the locked edge above `node`
    assert mid is not node and mid.lock_ref == 2 and node.parent is mid
    cache.unlock(mid)
    cache.check_integrity(held=[])
    cache.unlock(node)
    assert (cache.protected_size, cache.evictable_size) == (0, 4)
    cache.check_integrity(held=[])


def test_lock_of_an_evicted_node_and_unbalanced_unlock_raise() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2])
    _, match = cache.match_prefix([1, 2])
    with pytest.raises(KVIntegrityError, match="unlock without lock"):
        cache.unlock(match.node)
    cache.evict(2)
    with pytest.raises(KVIntegrityError, match="evicted"):
        cache.lock(match)
    cache.check_integrity(held=[])


def test_aborted_request_that_frees_its_slots_leaks_nothing() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3])
    node = cache.lock(cache.match_prefix([1, 2, 3, 4, 5, 6])[1])
    fresh = pool.alloc(3)
    cache.check_integrity(held=[fresh])
    with pytest.raises(KVIntegrityError, match="leaked"):
        cache.check_integrity(held=[])  # the request's slots are unaccounted for
    pool.free(fresh)  # abort: give back what the request owns, release its prefix
    cache.unlock(node)
    cache.check_integrity(held=[])
    assert pool.num_free + cache.total_size == pool.capacity


def test_integrity_catches_a_tree_slot_freed_behind_its_back() -> None:
    pool, cache = _cache()
    slots = _put(pool, cache, [1, 2, 3])
    pool.free(slots[1:2])  # a bug: the tree still owns this slot
    with pytest.raises(KVIntegrityError, match="free in the pool"):
        cache.check_integrity()


def test_integrity_catches_a_slot_held_twice() -> None:
    pool, cache = _cache()
    slots = _put(pool, cache, [1, 2, 3])
    with pytest.raises(KVIntegrityError, match="more than once"):
        cache.check_integrity(held=[slots[:1]])


def test_integrity_catches_broken_lock_counts() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3])
    _put(pool, cache, [1, 2, 4])
    leaf = cache.lock(cache.match_prefix([1, 2, 3])[1])
    leaf.parent.lock_ref = 0  # white-box: parent below its child
    with pytest.raises(KVIntegrityError, match="lock_ref"):
        cache.check_integrity()


def _shape(cache: RadixCache) -> list[tuple[tuple[int, ...], int, int, int]]:
    """Every node as (key, slots' first value, last_access, lock_ref), in a fixed order: equal
    before and after an operation that must not change the tree."""
    out, stack = [], [cache.root]
    while stack:
        node = stack.pop()
        first = int(node.value[0]) if node.value.numel() else -1
        out.append((node.key, first, node.last_access, node.lock_ref))
        stack.extend(node.children[k] for k in sorted(node.children))
    return out
