"""CompileService: memory LRU -> disk store -> Redis -> compile, single-flight, with a deadline.

``get_or_compile(spec)`` is thread-safe; ``aget_or_compile(spec)`` never blocks the event loop
(a memory hit is answered on the loop, anything else runs on a thread). Invariants:

* N concurrent requests for one uncached key compile it once; the others wait for that result
  (``flights``). An async caller cancelled while it waits (its client left) leaves the flight;
  when nobody waits any more, a worker compile is stopped (its worker is killed and replaced)
  and one still queued for a worker is dropped. In-process compiles finish and are cached.
* Entry keys and headers hold ``ANALYSIS_VERSION`` (a digest of the grammar code), so nothing
  compiled by another version of Corral's analysis is ever served.
* A caller waits at most ``config.compile_deadline_s`` (a worker compile: the worker's own
  deadline, its start-up not counted); past it the caller gets :class:`CompileUnavailable`
  (``compile_timeout``, HTTP 503 with ``Retry-After``), never cached. A worker past the deadline
  is killed; one that dies mid-compile is a ``compile_worker_failed`` and is replaced. An
  in-process compile past the deadline (see ``compiling`` for the routes) goes on: later callers
  join it rather than start another, and its outcome is cached when it finishes.
* A refusal (ConstraintError: the client's constraint) is cached for ``failure_ttl_s`` and
  raised again, as an equal error with the same ``limit``, without compiling. Other exceptions
  are server bugs: not cached.
* Disk and Redis entries are sealed under the service's key (``sealing``: an HMAC over the
  whole entry and its address). One that is not sealed under it, or was changed since, or does
  not load (truncated, garbled, other format/backend/tokenizer/analysis) is a miss: counted in
  ``rejected_entries`` by tier and reason (and ``corrupt_entries``) or in ``stale_entries``,
  deleted, recompiled and rewritten. Never served, never an error. Failed writes (read-only or
  full disk) leave the entry in memory. The key is ``config.key_file``'s, else the one generated
  in the cache folder; where that can be neither read nor made the disk store is off.
* With ``config.redis_url``, a miss in memory and on disk asks Redis, where replicas share their
  entries, and compiles only if no replica has it: the first replica to miss takes the entry's
  lock and compiles, the others wait for its entry (``redis_store``), at most the compile
  deadline (then ``compile_timeout``). An entry found in Redis is checked like a disk entry and
  written to disk behind; one compiled here goes to Redis at once and to disk behind. Redis
  unreachable: served from memory, disk and local compiles, reported by :meth:`degraded`.
* With ``config.redis_prefetch`` too, entries other replicas compile and announce are loaded
  into memory in the background (``prefetch``), leading their flight like a miss: a request
  that arrives meanwhile joins it; one that joined a load that found nothing looks again. Each
  loaded entry is made ready first (``prefetch.make_ready``: warmed, and ``prepare(spec, extra)``
  with what the publisher's ``describe(spec)`` said).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import time
import weakref
from collections.abc import Callable

from corral.grammar import (
    CompiledConstraint,
    CompileUnavailable,
    ConstraintError,
    ConstraintSpec,
    CorruptEntry,
    TokenizerInfo,
)
from corral.grammar.core.compiled import StaleEntry
from corral.schema_cache.compiling import Compiler
from corral.schema_cache.config import CacheConfig
from corral.schema_cache.disk import DiskStore
from corral.schema_cache.entries import Lookup, entry_key
from corral.schema_cache.flights import CompileCancelled, Flight, FlightMissed, Flights, bridge
from corral.schema_cache.memory import MemoryLRU, RefusalCache, fresh_copy
from corral.schema_cache.prefetch import Prefetcher, Prepare, make_ready, spec_bytes
from corral.schema_cache.redis_store import Claim, FleetBusy, Lease, open_shared, shared_state
from corral.schema_cache.sealing import KeyFileError, Sealer, SealKey, folder_key, read_key_file
from corral.schema_cache.stats import CacheStats
from corral.schema_cache.threads import DaemonThreads, SerialQueue
from corral.schema_cache.write_behind import WriteBehind

log = logging.getLogger(__name__)


class CompileService:
    """The compiled-constraint cache and compiler for one tokenizer.

    ``prepare(spec, extra)``: what the server builds per constraint besides its compiled form
    (the API's budget closer), run on each prefetched constraint so its first request finds it
    built; ``extra`` is what the publishing server's ``describe(spec)`` returned (JSON), published
    beside its entry (the API's schema forms).
    """

    def __init__(
        self,
        tok: TokenizerInfo,
        config: CacheConfig | None = None,
        prepare: Prepare | None = None,
        describe: Callable[[ConstraintSpec], dict] | None = None,
    ) -> None:
        self.tok = tok
        self._prepare = prepare
        self._describe = describe
        self.config = config or CacheConfig()
        self._stats = CacheStats()
        self.memory = MemoryLRU(
            self.config.max_memory_entries, self._stats, self.config.max_memory_bytes
        )
        key = _seal_key(self.config)  # raises KeyFileError for a configured key file
        #: Seals what the disk and Redis tiers store; None only with neither of them.
        self.sealer = Sealer(key, self._stats.reject) if key is not None else None
        self.disk = DiskStore(
            self.config.root,
            self.config.max_disk_bytes if key is not None else 0,
            self._stats,
            self.config.disk_rescan_interval_s,
        )
        self.shared = open_shared(self.config, self._stats)  # None without a Redis URL
        self._fingerprint = tok.fingerprint
        # llguidance's view of the tokenizer takes a second or two to build and holds the GIL
        # meanwhile: build it now, so that it never eats into the first compile's deadline.
        _ = tok.llguidance
        self._threads = DaemonThreads("corral-compile")
        self._flights = Flights()
        self._writes = WriteBehind(self.disk, self._flights, self.config, self._seal)
        atexit.register(_flush_at_exit, weakref.ref(self))
        self._refusals = RefusalCache(self.config.failure_ttl_s, self.config.max_memory_entries)
        self._compiler = Compiler(tok, self.config, self._stats)
        self._publishes = SerialQueue("corral-cache-publish")  # not gated: replicas wait for it
        self._prefetcher = (
            Prefetcher(self.shared, self._prefetch, self._stats, self.config.redis_retry_s)
            if self.shared is not None and self.config.redis_prefetch
            else None
        )

    # -- public API ------------------------------------------------------------------------------

    def get_or_compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """The compiled form of ``spec``; raises ConstraintError for the client's mistakes and
        CompileUnavailable when it could not be compiled now (deadline, worker died)."""
        return self.lookup(spec).compiled

    async def aget_or_compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """Like :meth:`get_or_compile`, without blocking the event loop, within the deadline.

        Cancelling the call (the client left) abandons the compile if no one else waits for it.
        """
        return (await self.alookup(spec)).compiled

    async def alookup(self, spec: ConstraintSpec) -> Lookup:
        """:meth:`aget_or_compile`, also saying where the result came from (as :meth:`lookup`)."""
        key = entry_key(spec.digest, self._fingerprint)
        found = self._cached(key)
        if found is not None:
            return found
        flight, leader = self._flights.join(key)
        abandon = False
        try:
            if leader:
                self._threads.submit(self._lead, spec, key, flight)
            else:
                self._stats.inc("singleflight_joins")
            try:
                found = await asyncio.wait_for(
                    bridge(flight.future), timeout=self._compiler.waiter_timeout(spec)
                )
            except TimeoutError:
                raise self._compiler.deadline_error(spec) from None
            except FlightMissed:
                return await self.alookup(spec)
            return found if leader else Lookup(found.compiled, "shared")
        except asyncio.CancelledError:
            abandon = True
            raise
        except (ConstraintError, CompileUnavailable) as e:
            raise fresh_copy(e) from None
        finally:
            self._flights.leave(flight, abandon=abandon)

    def lookup(self, spec: ConstraintSpec) -> Lookup:
        """Like :meth:`get_or_compile`, also saying where the result came from."""
        key = entry_key(spec.digest, self._fingerprint)
        found = self._cached(key)
        if found is not None:
            return found
        flight, leader = self._flights.join(key)
        try:
            if leader and self._compiler.waits_in_thread(spec):
                self._threads.submit(self._lead, spec, key, flight)
            elif leader:
                self._lead(spec, key, flight)  # here: a thread hop costs more than most compiles
            else:
                self._stats.inc("singleflight_joins")
            try:
                found = flight.future.result(timeout=self._compiler.waiter_timeout(spec))
            except TimeoutError:
                raise self._compiler.deadline_error(spec) from None
            except FlightMissed:
                return self.lookup(spec)
            return found if leader else Lookup(found.compiled, "shared")
        except (ConstraintError, CompileUnavailable) as e:
            raise fresh_copy(e) from None
        finally:
            self._flights.leave(flight)

    def stats(self) -> dict:
        """Counters (see ``stats.COUNTERS``), compile times, memory entries and disk bytes."""
        out = self._stats.snapshot()
        out["memory_entries"] = len(self.memory)
        out["memory_bytes"] = self.memory.bytes
        out["disk_bytes"] = self.disk.bytes_estimate() if self.disk.enabled else 0
        out["disk_max_bytes"] = self.config.max_disk_bytes
        out["redis_state"] = shared_state(self.shared)
        return out

    def degraded(self) -> dict[str, str]:
        """The tiers that are configured but not working now, and why (empty when all work)."""
        why = self.shared.down() if self.shared is not None else None
        return {"shared_cache": why} if why else {}

    def worker_pids(self) -> list[int]:
        """Process ids of the live compile workers (none until a compile needs one)."""
        return self._compiler.worker_pids()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every compiled entry so far is on disk and in Redis (written behind)."""
        return self._publishes.flush(timeout) and self._writes.flush(timeout)

    def close(self) -> None:
        """Finish the disk writes and stop the worker processes.

        In-process compiles still running are left to finish.
        """
        if self._prefetcher is not None:
            self._prefetcher.close()
        self.flush()
        self._compiler.close()
        if self.shared is not None:
            self.shared.close()

    def __enter__(self) -> CompileService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the miss path ---------------------------------------------------------------------------

    def _cached(self, key: str) -> Lookup | None:
        """A memory hit, or a cached refusal raised again; None for a miss."""
        hit = self.memory.get(key)
        if hit is not None:
            self._stats.inc("hits_memory")
            return Lookup(hit, "memory")
        refused = self._refusals.get(key)
        if refused is not None:
            self._stats.inc("hits_failure")
            raise refused
        return None

    def _lead(self, spec: ConstraintSpec, key: str, flight: Flight) -> None:
        """Answer one miss into ``flight.future`` (never raises: waiters get the exception)."""
        try:
            flight.future.set_result(self._load_or_compile(spec, key, flight))
        except BaseException as e:
            flight.future.set_exception(e)
        finally:
            self._flights.finish(key, flight)
            self._writes.miss_done()

    def _load_or_compile(self, spec: ConstraintSpec, key: str, flight: Flight) -> Lookup:
        hit = self.memory.get(key)  # a leader that finished just before we became one
        if hit is not None:
            self._stats.inc("hits_memory")
            return Lookup(hit, "memory")
        path = self.disk.path_for(key, self._fingerprint)
        data = self.disk.read(path) if self.disk.enabled else None
        compiled = self._checked("disk", key, spec.digest, data)
        if compiled is not None:
            self._stats.inc("hits_disk")
            self.memory.put(key, compiled)
            return Lookup(compiled, "disk")
        if data is not None:
            self.disk.discard(path)
        if self.shared is not None:
            return self._via_redis(spec, key, path, flight)
        compiled, seconds = self._compile_counted(spec, key, flight)
        self._keep(spec, key, path, compiled)
        return Lookup(compiled, "compiled", seconds)

    def _checked(
        self, tier: str, key: str, spec_digest: str, data: bytes | None
    ) -> CompiledConstraint | None:
        """The entry sealed in ``data`` (read from ``tier`` for ``key``) loaded, or None when
        there is none, its seal fails, or it does not load (counted, and logged once)."""
        if data is None:
            return None
        entry = self.sealer.open_entry(tier, key, data)
        if entry is None:
            return None
        try:
            return CompiledConstraint.from_bytes(entry, self.tok, spec_digest=spec_digest)
        except StaleEntry:
            self._stats.inc("stale_entries")
        except CorruptEntry:
            self.sealer.reject(tier, "invalid")
        return None

    def _seal(self, key: str, entry: bytes) -> bytes:
        return self.sealer.seal_entry(key, entry)

    def _via_redis(self, spec: ConstraintSpec, key: str, path: str, flight: Flight) -> Lookup:
        """Redis's entry (maybe once another replica compiled it), or compiled here and shared."""
        claim = self._claim(spec, key, flight)
        compiled = self._checked("redis", key, spec.digest, claim.data)
        if compiled is None and claim.data is not None:  # rejected: replace it
            self.shared.discard(key)
            claim = self._claim(spec, key, flight)
            compiled = self._checked("redis", key, spec.digest, claim.data)
        if compiled is not None:
            self._stats.inc("hits_redis")
            self.memory.put(key, compiled)
            self._writes.write(path, claim.data)
            return Lookup(compiled, "redis")
        try:
            compiled, seconds = self._compile_counted(spec, key, flight)
        except BaseException:
            if claim.lease is not None:
                self.shared.release(claim.lease)  # the next replica to ask compiles it
            raise
        self._keep(spec, key, path, compiled, claim.lease)
        return Lookup(compiled, "compiled", seconds)

    def _claim(self, spec: ConstraintSpec, key: str, flight: Flight) -> Claim:
        try:
            return self.shared.claim(key, self.config.compile_deadline_s, flight.is_cancelled)
        except FleetBusy:
            raise self._compiler.deadline_error(spec) from None

    def _keep(
        self,
        spec: ConstraintSpec,
        key: str,
        path: str,
        compiled: CompiledConstraint,
        lease: Lease | None = None,
    ) -> None:
        self.memory.put(key, compiled)
        if self.shared is not None:
            self._publishes.submit(self._publish, spec, key, path, compiled, lease)
        else:
            self._writes.store(key, path, compiled)

    def _publish(
        self,
        spec: ConstraintSpec,
        key: str,
        path: str,
        compiled: CompiledConstraint,
        lease: Lease | None,
    ) -> None:
        """To Redis now (other replicas may be waiting for it), then to disk behind."""
        data = self._seal(key, compiled.to_bytes())
        extra = self._describe(spec) if self._describe is not None else None
        published = self.sealer.seal_spec(key, spec_bytes(spec, extra))
        self.shared.publish(key, data, lease, compiled.spec_digest, published)
        self._writes.write(path, data)

    def _prefetch(self, key: str, spec_digest: str) -> None:
        """Load an entry another replica announced into memory, as the leader of its flight."""
        if key != entry_key(spec_digest, self._fingerprint):
            self._stats.inc("prefetch_foreign")  # another tokenizer, format or grammar code
            return
        if key in self.memory:
            self._stats.inc("prefetch_skipped")
            return
        flight, leader = self._flights.join(key)
        if not leader:  # a request is fetching or compiling it now
            self._flights.leave(flight)
            self._stats.inc("prefetch_skipped")
            return
        compiled = None
        try:
            data = self.shared.get(key)
            compiled = self._checked("redis", key, spec_digest, data)
            if compiled is not None:  # ready before anyone uses it, requests that joined too
                published = self._published_spec(key)
                make_ready(compiled, self.tok, published, self._prepare)
                self.memory.put(key, compiled)
        finally:  # whatever happened, the waiters get an answer
            self._flights.finish(key, flight)  # first: a waiter that looks again leads
            if compiled is None:  # gone from Redis meanwhile, Redis down, or does not load
                flight.future.set_exception(FlightMissed(key))
            else:
                flight.future.set_result(Lookup(compiled, "prefetched"))
            self._flights.leave(flight)
        if compiled is None:
            self._stats.inc("prefetch_skipped")
            return
        self._stats.inc("prefetched")
        self._writes.write(self.disk.path_for(key, self._fingerprint), data)  # as a Redis hit

    def _published_spec(self, key: str) -> Callable[[], bytes | None]:
        """Reads the constraint published beside ``key``'s entry, opened from its seal."""
        return lambda: self.sealer.open_spec(key, self.shared.spec(key))

    def _compile_counted(
        self, spec: ConstraintSpec, key: str, flight: Flight
    ) -> tuple[CompiledConstraint, float]:
        t0 = time.perf_counter()
        try:
            compiled, seconds = self._compiler.compile(spec, flight)
        except ConstraintError as e:
            self._stats.inc("compile_failures")
            self._stats.observe_compile(time.perf_counter() - t0)
            self._refusals.put(key, e)
            raise
        except (CompileUnavailable, CompileCancelled):
            raise  # counted where it happened (deadline_hits, worker_failures, ...)
        except Exception:
            self._stats.inc("compile_errors")
            raise
        self._stats.inc("compiles")
        self._stats.observe_compile(seconds)
        return compiled, seconds


def _seal_key(config: CacheConfig) -> SealKey | None:
    """The key stored entries are sealed under: ``config.key_file``'s (a KeyFileError if it
    cannot be used), else the cache folder's own (None where it cannot be read or made, or the
    disk store is off: then no tier stores anything)."""
    if config.key_file is not None:
        return read_key_file(config.key_file)
    if config.max_disk_bytes == 0:
        return None
    try:
        return folder_key(config.root)
    except (OSError, KeyFileError) as e:
        log.warning(
            "compiled-constraint cache: no key to seal disk entries with (%s); the disk store "
            "is off (name a key file to use it)",
            e,
        )
        return None


def _flush_at_exit(ref: weakref.ref) -> None:
    service = ref()
    if service is not None:
        service.flush(timeout=10)
