"""RadixCache: focused unit tests of match / insert / split / lock / evict / integrity, and a
hypothesis state machine that checks the cache against a naive dict model."""

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from corral.engine.kv_pool import KVIntegrityError, KVPool
from corral.engine.radix_cache import RadixCache


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


# ---- hypothesis state machine against a naive model -------------------------------------

MAX_LEN = 8
# A 3-token alphabet makes sequences share prefixes, so edges split constantly.
SEQS = st.lists(st.integers(0, 2), min_size=1, max_size=MAX_LEN).map(tuple)


@dataclass
class _Live:
    """What a running request holds: a locked cached prefix and its own fresh slots."""

    ids: tuple[int, ...]
    prefix: torch.Tensor
    fresh: torch.Tensor
    node: object


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


def _tree_contents(cache: RadixCache) -> dict[tuple[int, ...], int]:
    """Every cached prefix -> the slot of its last token, read off the tree's nodes."""
    out: dict[tuple[int, ...], int] = {}
    stack = [((), cache.root)]
    while stack:
        path, node = stack.pop()
        for tok, slot in zip(node.key, node.value.tolist(), strict=True):
            path = path + (tok,)
            out[path] = slot
        stack.extend((path, child) for child in node.children.values())
    return out


class RadixMachine(RuleBasedStateMachine):
    """The model: `cached` maps each cached prefix to its last token's slot (prefix-closed);
    `used` maps it to the model clock of its last lock/insert, for the LRU check (a match alone
    is a pure query: it must leave the tree, clocks included, exactly as it was)."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = KVPool(1, 1, 1, num_slots=33)
        self.cache = RadixCache(self.pool)
        self.cached: dict[tuple[int, ...], int] = {}
        self.used: dict[tuple[int, ...], int] = {}
        self.clock = 0
        self.live: list[_Live] = []

    # -- model helpers
    def _model_match(self, ids: tuple[int, ...]) -> int:
        n = 0
        while n < len(ids) and ids[: n + 1] in self.cached:
            n += 1
        return n

    def _touch(self, ids: tuple[int, ...], upto: int) -> None:
        self.clock += 1
        for i in range(1, upto + 1):
            self.used[ids[:i]] = self.clock

    def _locked(self) -> set[tuple[int, ...]]:
        return {r.ids[:i] for r in self.live for i in range(1, r.prefix.numel() + 1)}

    def _match(self, ids: tuple[int, ...]) -> tuple[torch.Tensor, object]:
        before = _shape(self.cache)
        idx, match = self.cache.match_prefix(ids)
        n = self._model_match(ids)
        assert idx.tolist() == [self.cached[ids[:i]] for i in range(1, n + 1)]
        assert _shape(self.cache) == before
        return idx, match

    def _insert(self, ids: tuple[int, ...], slots: torch.Tensor) -> None:
        expected = self._model_match(ids)
        assert self.cache.insert(ids, slots) == expected
        for i, slot in enumerate(slots.tolist(), start=1):
            kept = self.cached.setdefault(ids[:i], slot)
            assert kept == slot or bool(self.pool.is_free(torch.tensor([slot])))
        self._touch(ids, len(ids))

    def _alloc(self, n: int) -> torch.Tensor | None:
        got = self.pool.alloc(n)
        if got is None:
            self._evict(n - self.pool.num_free)
            got = self.pool.alloc(n)
        return got

    def _evict(self, n: int) -> None:
        before, locked = dict(self.cached), self._locked()
        evictable = len(before) - len(locked)
        assert self.cache.evictable_size == evictable
        freed = self.cache.evict(n)
        after = _tree_contents(self.cache)
        removed = before.keys() - after.keys()
        assert after.items() <= before.items() and locked <= after.keys()
        assert freed == len(removed) and freed <= evictable
        assert freed >= min(n, evictable) and freed <= max(n, 0) + MAX_LEN - 1
        assert all(self.pool.is_free(torch.tensor([before[k]])) for k in removed)
        parents = {k[:-1] for k in after}
        leaves = [k for k in after if k not in parents and k not in locked]
        if removed and leaves:  # LRU: nothing evicted was used after a surviving leaf
            assert max(self.used[k] for k in removed) <= min(self.used[k] for k in leaves)
        self.cached = after

    # -- rules
    @precondition(lambda self: len(self.live) < 4)
    @rule(ids=SEQS)
    def start_request(self, ids: tuple[int, ...]) -> None:
        prefix, match = self._match(ids)
        node = self.cache.lock(match)
        self._touch(ids, prefix.numel())
        req = _Live(ids, prefix, torch.empty(0, dtype=torch.int64), node)
        self.live.append(req)  # before _alloc: its eviction must see this lock
        fresh = self._alloc(len(ids) - prefix.numel())
        if fresh is None:  # pool full of locked / held slots: the request waits
            self.live.pop()
            self.cache.unlock(node)
            return
        req.fresh = fresh

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        r = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        self._insert(r.ids, torch.cat([r.prefix, r.fresh]))
        self.cache.unlock(r.node)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        """Keep the KV computed so far (possibly none of the new tokens), free the rest."""
        r = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        p = r.prefix.numel()
        k = data.draw(st.integers(p, len(r.ids)))
        if k:
            self._insert(r.ids[:k], torch.cat([r.prefix, r.fresh[: k - p]]))
        self.pool.free(r.fresh[k - p :])
        self.cache.unlock(r.node)

    @rule(ids=SEQS)
    def insert_fresh(self, ids: tuple[int, ...]) -> None:
        slots = self._alloc(len(ids))
        if slots is not None:
            self._insert(ids, slots)

    @rule(ids=SEQS)
    def match(self, ids: tuple[int, ...]) -> None:
        self._match(ids)

    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        self._evict(n)

    @invariant()
    def consistent(self) -> None:
        self.cache.check_integrity(held=[r.fresh for r in self.live])
        assert _tree_contents(self.cache) == self.cached
        locked = self._locked()
        assert self.cache.protected_size == len(locked)
        assert self.cache.evictable_size == len(self.cached) - len(locked)


RadixMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_radix_cache_against_naive_model = RadixMachine.TestCase
