"""RadixCache against a naive dict model: a hypothesis state machine of inserts, matches,
locks, request hand-overs and evictions (the focused unit tests are in `test_engine_radix.py`)."""

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_engine_radix import _shape

from corral.engine.kvcache.kv_pool import KVPool
from corral.engine.kvcache.radix_cache import RadixCache

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
