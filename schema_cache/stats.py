"""Counters of the cache and the compile service, for ``/metrics`` and ``corral cache stats``."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from corral.schema_cache.sealing import REASONS, TIERS

#: Every counter the service keeps; all start at zero.
COUNTERS = (
    "hits_memory",  # served from the in-process LRU
    "hits_disk",  # served from the disk store (a new process, or after memory eviction)
    "hits_failure",  # a cached refusal re-raised without compiling again
    "singleflight_joins",  # waited on another caller's in-flight compile of the same key
    "compiles",  # compiles that produced a constraint
    "compile_failures",  # compiles refused as the client's mistake (ConstraintError)
    "compile_errors",  # compiles that failed for another reason (a server bug)
    "deadline_hits",  # compiles stopped (worker), abandoned (thread) or no longer awaited
    "worker_failures",  # compiles lost to a worker that died or could not start (HTTP 503)
    "compiles_cancelled",  # worker compiles stopped because no caller waited for them any more
    "deadline_overruns",  # compiles in the calling thread that finished after the deadline
    "corrupt_entries",  # disk or Redis entries rejected (``sealing``: unsealed, tampered, under
    # another key, truncated, or sealed but not loading here): a miss; by tier and reason in
    # ``rejected_entries``
    "stale_entries",  # disk or Redis entries compiled by another version of the grammar code
    "hits_redis",  # served from the shared Redis tier (compiled by this or another replica)
    "redis_lock_waits",  # misses that waited for another replica compiling the same entry
    "redis_writes",  # entries published to Redis
    "redis_errors",  # Redis commands that failed or timed out (each one served locally)
    "prefetched",  # entries other replicas announced, loaded into memory before a request asked
    "prefetch_skipped",  # announced entries not loaded: held or in flight already, backlog
    # full, or gone from Redis (each is loaded on first request instead)
    "prefetch_foreign",  # announced entries of another tokenizer or Corral version: ignored
    "disk_writes",
    "disk_write_skipped",  # entries larger than the whole disk budget, kept in memory only
    "disk_write_errors",  # a failed write (disk full, permissions): the entry stays in memory
    "evictions_disk",
    "evictions_memory",
    "memory_skipped",  # compiled constraints larger than the whole memory budget: not kept
    "worker_restarts",  # worker processes killed at the deadline or found dead, and replaced
    "compiles_in_process",
    "compiles_in_worker",
)

_RECENT = 1024  # compile times kept for percentiles


class CacheStats:
    """Thread-safe counters plus the compile-time sum, count and recent samples."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._rejected = {(t, r): 0 for t in TIERS for r in REASONS}  # all shown from zero
        self._compile_s_sum = 0.0
        self._compile_n = 0
        self._recent: deque[float] = deque(maxlen=_RECENT)

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def reject(self, tier: str, reason: str) -> None:
        """A ``tier`` entry rejected for ``reason``; also counted in ``corrupt_entries``."""
        with self._lock:
            self._rejected[tier, reason] += 1
            self._counts["corrupt_entries"] += 1

    def observe_compile(self, seconds: float) -> None:
        with self._lock:
            self._compile_s_sum += seconds
            self._compile_n += 1
            self._recent.append(seconds)

    def get(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict[str, Any]:
        """All counters, ``compile_seconds_sum``/``_count``, recent compile times (seconds) and
        ``rejected_entries``: ``{"<tier>/<reason>": n}`` for every tier and reason."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            out["rejected_entries"] = {f"{t}/{r}": n for (t, r), n in self._rejected.items()}
            out["compile_seconds_sum"] = self._compile_s_sum
            out["compile_seconds_count"] = self._compile_n
            out["compile_seconds_recent"] = list(self._recent)
        return out
