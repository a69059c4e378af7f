"""In-process caches keyed by entry key: compiled constraints (LRU) and recent refusals."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from corral.grammar import CompiledConstraint, ConstraintError
from corral.schema_cache.stats import CacheStats


class MemoryLRU:
    """At most ``max_entries`` compiled constraints; the least recently used goes first."""

    def __init__(self, max_entries: int, stats: CacheStats) -> None:
        self.max_entries = max_entries
        self._stats = stats
        self._lock = threading.Lock()
        self._items: OrderedDict[str, CompiledConstraint] = OrderedDict()

    def get(self, key: str) -> CompiledConstraint | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: str, item: CompiledConstraint) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
                self._stats.inc("evictions_memory")

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class RefusalCache:
    """Refusals (ConstraintError) by entry key, each kept ``ttl_s`` seconds, at most ``max_entries``."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max(1, max_entries)
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[ConstraintError, float]] = OrderedDict()

    def put(self, key: str, error: ConstraintError) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            self._items[key] = (error, time.monotonic() + self.ttl_s)
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def get(self, key: str) -> ConstraintError | None:
        """A fresh copy of the cached refusal (safe to raise in any thread), or None."""
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            error, expires = found
            if time.monotonic() >= expires:
                del self._items[key]
                return None
        return ConstraintError(error.reason, error.pointer, error.keyword)
