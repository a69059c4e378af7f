"""Disk writes behind the compiles, and out of their way.

A compiled entry goes to memory at once and to disk later, on one writer thread
(``SerialQueue``): a compile's caller never waits for the file system. On a small machine a
write running beside a compile (or beside the first mask its caller computes right after) still
delays it, so a write waits until no miss is being answered and none was in the last
``write_quiet_s``, but never past ``write_max_delay_s`` after it was submitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from corral.grammar import CompiledConstraint
from corral.schema_cache.config import CacheConfig
from corral.schema_cache.disk import DiskStore
from corral.schema_cache.flights import Flights
from corral.schema_cache.threads import SerialQueue, weak_gate


class WriteBehind:
    """The disk writes of one compile service; a no-op where the disk store is disabled."""

    def __init__(
        self,
        disk: DiskStore,
        flights: Flights,
        config: CacheConfig,
        seal: Callable[[str, bytes], bytes],
    ) -> None:
        """``seal(key, entry)``: the sealed frame the disk stores for an entry's bytes."""
        self._disk, self._flights, self._config = disk, flights, config
        self._seal = seal
        self._last_miss_done = 0.0  # time.monotonic() when the last miss was answered
        self._queue = SerialQueue("corral-cache-write", gate=weak_gate(self._wait))

    def miss_done(self) -> None:
        """A miss was just answered: writes keep out of the way a little longer."""
        self._last_miss_done = time.monotonic()

    def write(self, path: str, data: bytes) -> None:
        """Write an entry's sealed bytes to ``path``, behind."""
        if self._disk.enabled:
            self._queue.submit(self._disk.write, path, data)

    def store(self, key: str, path: str, compiled: CompiledConstraint) -> None:
        """Serialise, seal (for ``key``) and write a compiled entry, all behind."""
        if self._disk.enabled:
            self._queue.submit(self._store, key, path, compiled)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every write submitted so far is done; False if ``timeout`` passed first."""
        return self._queue.flush(timeout)

    def _store(self, key: str, path: str, compiled: CompiledConstraint) -> None:
        self._disk.write(path, self._seal(key, compiled.to_bytes()))

    def _wait(self, submitted: float) -> float:
        """Seconds a write submitted at ``submitted`` should still wait."""
        now = time.monotonic()
        left = submitted + self._config.write_max_delay_s - now
        if left <= 0:
            return 0.0
        if self._flights.busy():
            return min(left, self._config.write_quiet_s)
        return min(left, self._last_miss_done + self._config.write_quiet_s - now)
