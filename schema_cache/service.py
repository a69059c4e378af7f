"""CompileService: memory LRU -> disk store -> compile, single-flight, with a deadline.

``get_or_compile(spec)`` is thread-safe; ``aget_or_compile(spec)`` never blocks the event loop
(a memory hit is answered on the loop, anything else runs on a thread). Invariants:

* N concurrent requests for one uncached key compile it once; the others wait for that result.
* A compile past ``config.compile_deadline_s`` is a ConstraintError naming the deadline (the
  constraint is too complex: an HTTP 400). Where the compile runs (``config.isolation``):

  - ``auto``: constraints that could run away (see ``routing``) compile in a worker process,
    which is killed at the deadline. The rest compile in the calling thread, with no hand-off
    (a thread hop costs more than a typical compile on a busy machine); ``aget_or_compile``
    stops waiting for them at the deadline, and a synchronous caller that outlived it is
    counted in ``deadline_overruns``.
  - ``thread``: every compile runs on a helper thread and is abandoned at the deadline (it
    finishes in the background; llguidance bounds its own work).
  - ``process``: every compile runs in a worker process.
* A refusal (ConstraintError, a worker's deadline included) is cached for ``failure_ttl_s`` and
  raised again, as an equal error, without compiling. Other exceptions are server bugs: not
  cached. A deadline only the async waiter gave up on is not cached: the compile may finish,
  and then the next request is a memory hit.
* A disk entry that does not load (truncated, garbled, other format/backend/tokenizer) is a
  miss: counted in ``corrupt_entries``, deleted, recompiled and rewritten. Never an error.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple

from corral.grammar import (
    CompiledConstraint,
    ConstraintError,
    ConstraintSpec,
    CorruptEntry,
    TokenizerInfo,
    compile_constraint,
)
from corral.grammar.compiled import FORMAT_VERSION
from corral.schema_cache.config import CacheConfig
from corral.schema_cache.disk import STORE_VERSION, DiskStore
from corral.schema_cache.memory import MemoryLRU, RefusalCache
from corral.schema_cache.routing import needs_process
from corral.schema_cache.stats import CacheStats
from corral.schema_cache.threads import DaemonThreads, SerialQueue
from corral.schema_cache.workers import DeadlineExceeded, WorkerFailed, WorkerPool


def entry_key(spec_digest: str, tokenizer_fingerprint: str) -> str:
    """The content address of one compiled constraint (its disk path derives from it)."""
    text = f"{spec_digest}|{tokenizer_fingerprint}|{FORMAT_VERSION}|{STORE_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()


class Lookup(NamedTuple):
    """A compiled constraint and where it came from: memory, disk, compiled or shared."""

    compiled: CompiledConstraint
    source: str


class CompileService:
    """The compiled-constraint cache and compiler for one tokenizer."""

    def __init__(self, tok: TokenizerInfo, config: CacheConfig | None = None) -> None:
        self.tok = tok
        self.config = config or CacheConfig()
        self._stats = CacheStats()
        self.memory = MemoryLRU(self.config.max_memory_entries, self._stats)
        self.disk = DiskStore(
            self.config.root,
            self.config.max_disk_bytes,
            self._stats,
            self.config.disk_rescan_interval_s,
        )
        self._fingerprint = tok.fingerprint
        # llguidance's view of the tokenizer takes a second or two to build and holds the GIL
        # meanwhile: build it now, so that it never eats into the first compile's deadline.
        _ = tok.llguidance
        self._threads = DaemonThreads("corral-compile")
        self._writes = SerialQueue("corral-cache-write", gate=_weak_gate(self._write_wait))
        atexit.register(_flush_at_exit, weakref.ref(self))
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self._last_miss_done = 0.0  # time.monotonic() when the last miss was answered
        self._refusals = RefusalCache(self.config.failure_ttl_s, self.config.max_memory_entries)
        self._pool: WorkerPool | None = None
        if self.config.isolation == "process" or self.config.prestart_workers:
            self._worker_pool()  # starts the workers without waiting for them

    # -- public API ------------------------------------------------------------------------------

    def get_or_compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """The compiled form of ``spec``; raises ConstraintError for the client's mistakes."""
        return self.lookup(spec).compiled

    async def aget_or_compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """Like :meth:`get_or_compile`, without blocking the event loop, within the deadline."""
        hit = self.memory.get(entry_key(spec.digest, self._fingerprint))
        if hit is not None:
            self._stats.inc("hits_memory")
            return hit
        waiting = asyncio.wrap_future(self._threads.submit(self.get_or_compile, spec))
        if self._route(spec) != "inline":
            return await waiting  # the compile itself is bounded by the deadline
        # Retrieve the outcome even if we stop waiting, so asyncio never logs it as lost.
        waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            return await asyncio.wait_for(
                asyncio.shield(waiting), timeout=self.config.compile_deadline_s
            )
        except TimeoutError:
            raise self._deadline_error(spec) from None

    def lookup(self, spec: ConstraintSpec) -> Lookup:
        """Like :meth:`get_or_compile`, also saying where the result came from."""
        key = entry_key(spec.digest, self._fingerprint)
        hit = self.memory.get(key)
        if hit is not None:
            self._stats.inc("hits_memory")
            return Lookup(hit, "memory")
        refused = self._refusals.get(key)
        if refused is not None:
            self._stats.inc("hits_failure")
            raise refused
        with self._lock:
            fut = self._inflight.get(key)
            leader = fut is None
            if leader:
                fut = self._inflight[key] = Future()
        if not leader:
            self._stats.inc("singleflight_joins")
            try:
                return Lookup(fut.result(), "shared")
            except ConstraintError as e:
                raise _copy(e) from None
        try:
            found = self._load_or_compile(spec, key)
            fut.set_result(found.compiled)
            return found
        except BaseException as e:
            fut.set_exception(e)
            raise
        finally:
            with self._lock:
                del self._inflight[key]
                self._last_miss_done = time.monotonic()

    def stats(self) -> dict:
        """Counters (see ``stats.COUNTERS``), compile times, memory entries and disk bytes."""
        out = self._stats.snapshot()
        out["memory_entries"] = len(self.memory)
        out["disk_bytes"] = self.disk.bytes_estimate() if self.disk.enabled else 0
        out["disk_max_bytes"] = self.config.max_disk_bytes
        return out

    def worker_pids(self) -> list[int]:
        """Process ids of the live compile workers (none until a compile needs one)."""
        return self._pool.pids() if self._pool else []

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every compiled entry so far is on disk (entries are written behind)."""
        return self._writes.flush(timeout)

    def close(self) -> None:
        """Finish the disk writes and stop the worker processes.

        In-process compiles still running are left to finish.
        """
        self.flush()
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> CompileService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the miss path ---------------------------------------------------------------------------

    def _load_or_compile(self, spec: ConstraintSpec, key: str) -> Lookup:
        hit = self.memory.get(key)  # a leader that finished just before we became one
        if hit is not None:
            self._stats.inc("hits_memory")
            return Lookup(hit, "memory")
        path = self.disk.path_for(key, self._fingerprint)
        data = self.disk.read(path) if self.disk.enabled else None
        if data is not None:
            try:
                compiled = CompiledConstraint.from_bytes(data, self.tok, spec_digest=spec.digest)
            except CorruptEntry:
                self._stats.inc("corrupt_entries")
                self.disk.discard(path)
            else:
                self._stats.inc("hits_disk")
                self.memory.put(key, compiled)
                return Lookup(compiled, "disk")
        compiled = self._compile_counted(spec, key)
        self.memory.put(key, compiled)
        if self.disk.enabled:
            self._writes.submit(self._store, path, compiled)
        return Lookup(compiled, "compiled")

    def _write_wait(self, submitted: float) -> float:
        """Seconds a disk write submitted at ``submitted`` should still wait.

        Writes are behind the compile, and also out of its way: on a small machine a write
        running beside a compile (or beside the first mask its caller computes right after)
        delays it, so a write waits until no miss is being answered and none was in the last
        ``write_quiet_s``, but never past ``write_max_delay_s`` after it was submitted."""
        now = time.monotonic()
        left = submitted + self.config.write_max_delay_s - now
        if left <= 0:
            return 0.0
        if self._inflight:
            return min(left, self.config.write_quiet_s)
        return min(left, self._last_miss_done + self.config.write_quiet_s - now)

    def _store(self, path: str, compiled: CompiledConstraint) -> None:
        self.disk.write(path, compiled.to_bytes())

    def _compile_counted(self, spec: ConstraintSpec, key: str) -> CompiledConstraint:
        t0 = time.perf_counter()
        try:
            compiled, seconds = self._compile(spec)
        except ConstraintError as e:
            self._stats.inc("compile_failures")
            self._stats.observe_compile(time.perf_counter() - t0)
            self._refusals.put(key, e)
            raise
        except Exception:
            self._stats.inc("compile_errors")
            raise
        self._stats.inc("compiles")
        self._stats.observe_compile(seconds)
        return compiled

    def _route(self, spec: ConstraintSpec) -> str:
        """Where ``spec`` compiles: ``worker``, ``thread`` or ``inline`` (the calling thread)."""
        isolation = self.config.isolation
        if isolation == "process":
            return "worker"
        if isolation == "thread":
            return "thread"
        return "worker" if needs_process(spec, self.config.inline_max_source_bytes) else "inline"

    def _compile(self, spec: ConstraintSpec) -> tuple[CompiledConstraint, float]:
        """The compiled constraint and the compile's seconds (without a worker's start-up)."""
        deadline = self.config.compile_deadline_s
        route = self._route(spec)
        if route == "worker":
            return self._compile_in_worker(spec)
        self._stats.inc("compiles_in_process")
        t0 = time.perf_counter()
        if route == "inline":
            compiled = compile_constraint(spec, self.tok)
            seconds = time.perf_counter() - t0
            if seconds > deadline:
                self._stats.inc("deadline_overruns")
            return compiled, seconds
        fut = self._threads.submit(compile_constraint, spec, self.tok)
        try:
            return fut.result(timeout=deadline), time.perf_counter() - t0
        except TimeoutError:
            raise self._deadline_error(spec) from None

    def _compile_in_worker(self, spec: ConstraintSpec) -> tuple[CompiledConstraint, float]:
        self._stats.inc("compiles_in_worker")
        try:
            data, seconds = self._worker_pool().compile(spec, self.config.compile_deadline_s)
        except DeadlineExceeded:
            raise self._deadline_error(spec) from None
        t0 = time.perf_counter()
        try:
            compiled = CompiledConstraint.from_bytes(data, self.tok, spec_digest=spec.digest)
        except CorruptEntry as e:  # the worker and we disagree: a bug, not the client's
            raise WorkerFailed(f"a worker's compiled constraint does not load: {e}") from e
        return compiled, seconds + time.perf_counter() - t0

    def _deadline_error(self, spec: ConstraintSpec) -> ConstraintError:
        self._stats.inc("deadline_hits")
        return ConstraintError(
            f"compiling this {spec.kind} constraint exceeded its deadline of "
            f"{self.config.compile_deadline_s:g} s; simplify it (fewer or shallower "
            "anyOf/oneOf/allOf branches, smaller enums or alternations) and retry",
            keyword="deadline",
        )

    def _worker_pool(self) -> WorkerPool:
        with self._lock:
            if self._pool is None:
                self._pool = WorkerPool(
                    self.tok,
                    self.config.process_workers,
                    self._stats,
                    self.config.worker_start_timeout_s,
                )
            return self._pool


def _weak_gate(method: Callable[[float], float]) -> Callable[[float], float]:
    """The writer's gate without a strong reference: its thread outlives the service."""
    ref = weakref.WeakMethod(method)

    def gate(submitted: float) -> float:
        live = ref()
        return live(submitted) if live is not None else 0.0

    return gate


def _flush_at_exit(ref: weakref.ref) -> None:
    service = ref()
    if service is not None:
        service.flush(timeout=10)


def _copy(e: ConstraintError) -> ConstraintError:
    """An equal, fresh error: one exception object raised in several threads shares a traceback."""
    return ConstraintError(e.reason, e.pointer, e.keyword)
