"""In-process caches keyed by entry key: compiled constraints (LRU) and recent refusals."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from corral.grammar import CompiledConstraint, CompileUnavailable, ConstraintError
from corral.schema_cache.stats import CacheStats


class MemoryLRU:
    """Compiled constraints, least recently used evicted first, bounded in count and in bytes.

    An entry's size is ``CompiledConstraint.size_bytes`` (its payload plus an estimate of the
    backend's native compiled form). An entry larger than the whole byte budget is not kept.
    """

    def __init__(self, max_entries: int, stats: CacheStats, max_bytes: int | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._stats = stats
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[CompiledConstraint, int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> CompiledConstraint | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: str, item: CompiledConstraint) -> None:
        if self.max_entries == 0:
            return
        size = item.size_bytes
        if self.max_bytes is not None and size > self.max_bytes:
            self._stats.inc("memory_skipped")
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (item, size)
            self._bytes += size
            while len(self._items) > self.max_entries or (
                self.max_bytes is not None and self._bytes > self.max_bytes
            ):
                _, (_, freed) = self._items.popitem(last=False)
                self._bytes -= freed
                self._stats.inc("evictions_memory")

    def __contains__(self, key: str) -> bool:
        """Whether ``key`` is held (its place in the LRU order unchanged)."""
        with self._lock:
            return key in self._items

    @property
    def bytes(self) -> int:
        """The estimated bytes of the entries held."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

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
        return copy_refusal(error)


def copy_refusal(e: ConstraintError) -> ConstraintError:
    """An equal, fresh error (one exception object raised in several threads shares a
    traceback), with every field kept: reason, pointer, keyword and limit."""
    return ConstraintError(e.reason, e.pointer, e.keyword, e.limit)


def fresh_copy(e: ConstraintError | CompileUnavailable) -> Exception:
    """An equal, fresh exception for one waiter of a flight (see :func:`copy_refusal`)."""
    if isinstance(e, ConstraintError):
        return copy_refusal(e)
    return CompileUnavailable(e.reason, e.code, e.retry_after_s)
