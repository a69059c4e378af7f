"""Where and how one compile runs: in the calling thread, on a helper thread, or in a worker.

``Compiler.compile`` answers a compiled constraint and its seconds, or raises ConstraintError
(the client's constraint), CompileUnavailable (deadline missed, worker died: retry later),
CompileCancelled (nobody waits any more) or another exception (a server bug).

Routes (``config.isolation``; see ``routing``):

- ``inline`` (``auto``, ordinary constraints): in the thread that leads the flight, with no
  hand-off (a thread hop costs more than a typical compile on a busy machine); for a synchronous
  caller that is its own thread. Async callers stop waiting at the deadline.
- ``thread``: on a helper thread; every caller stops waiting at the deadline, while the compile
  finishes in the background (llguidance bounds its own work) and its outcome is then cached.
- ``worker``: in a worker process (``workers``), killed at the deadline.

A compile in process that ran past the deadline is counted in ``deadline_overruns``.
"""

from __future__ import annotations

import math
import threading
import time

from corral.grammar import (
    CompiledConstraint,
    CompileUnavailable,
    ConstraintSpec,
    CorruptEntry,
    TokenizerInfo,
    compile_constraint,
)
from corral.schema_cache.config import CacheConfig
from corral.schema_cache.flights import CompileCancelled, Flight
from corral.schema_cache.routing import needs_process
from corral.schema_cache.stats import CacheStats
from corral.schema_cache.workers import DeadlineExceeded, WorkerFailed, WorkerPool

#: Seconds a client is told to wait after a worker died under its compile.
WORKER_FAILED_RETRY_S = 1


class Compiler:
    """Runs compiles for one tokenizer, on the route each constraint needs."""

    def __init__(self, tok: TokenizerInfo, config: CacheConfig, stats: CacheStats) -> None:
        self.tok = tok
        self.config = config
        self._stats = stats
        self._lock = threading.Lock()
        self._pool: WorkerPool | None = None
        if config.isolation == "process" or config.prestart_workers:
            self._worker_pool()  # starts the workers without waiting for them

    def route(self, spec: ConstraintSpec) -> str:
        """Where ``spec`` compiles: ``worker``, ``thread`` or ``inline`` (the calling thread)."""
        isolation = self.config.isolation
        if isolation == "process":
            return "worker"
        if isolation == "thread":
            return "thread"
        return "worker" if needs_process(spec, self.config.inline_max_source_bytes) else "inline"

    def waits_in_thread(self, spec: ConstraintSpec) -> bool:
        """Whether ``spec``'s compile runs on a helper thread (not in its first caller's)."""
        return self.route(spec) == "thread"

    def waiter_timeout(self, spec: ConstraintSpec) -> float | None:
        """How long a caller waits for ``spec``'s compile: the deadline, except for a worker
        compile, which the worker's own deadline bounds (its start-up is not counted)."""
        return None if self.route(spec) == "worker" else self.config.compile_deadline_s

    def compile(
        self, spec: ConstraintSpec, flight: Flight | None = None
    ) -> tuple[CompiledConstraint, float]:
        """The compiled constraint and the compile's seconds (without a worker's start-up);
        ``flight`` lets a worker compile be cancelled."""
        if self.route(spec) == "worker":
            return self._in_worker(spec, flight)
        self._stats.inc("compiles_in_process")
        t0 = time.perf_counter()
        compiled = compile_constraint(spec, self.tok)
        seconds = time.perf_counter() - t0
        if seconds > self.config.compile_deadline_s:
            self._stats.inc("deadline_overruns")
        return compiled, seconds

    def _in_worker(
        self, spec: ConstraintSpec, flight: Flight | None
    ) -> tuple[CompiledConstraint, float]:
        self._stats.inc("compiles_in_worker")
        try:
            data, seconds = self._worker_pool().compile(
                spec, self.config.compile_deadline_s, flight
            )
        except DeadlineExceeded:
            raise self.deadline_error(spec) from None
        except CompileCancelled:
            self._stats.inc("compiles_cancelled")
            raise
        except WorkerFailed as e:
            self._stats.inc("worker_failures")
            raise CompileUnavailable(
                f"the compile could not be finished: {e}; retry shortly",
                code="compile_worker_failed",
                retry_after_s=WORKER_FAILED_RETRY_S,
            ) from None
        t0 = time.perf_counter()
        try:
            compiled = CompiledConstraint.from_bytes(data, self.tok, spec_digest=spec.digest)
        except CorruptEntry as e:
            # The worker and this process disagree: a worker started from grammar code that
            # changed on disk under a running server, or a bug. Never the client's mistake, and
            # nothing a retry of this request would fix by itself: a 503 that says so.
            self._stats.inc("worker_failures")
            raise CompileUnavailable(
                f"a compile worker's result does not load here ({e}); if Corral was upgraded "
                "while this server ran, restart it",
                code="compile_worker_failed",
                retry_after_s=WORKER_FAILED_RETRY_S,
            ) from e
        return compiled, seconds + time.perf_counter() - t0

    def deadline_error(self, spec: ConstraintSpec) -> CompileUnavailable:
        """A missed deadline: not the client's mistake and never cached; retry after it."""
        self._stats.inc("deadline_hits")
        deadline = self.config.compile_deadline_s
        return CompileUnavailable(
            f"compiling this {spec.kind} constraint did not finish within its deadline of "
            f"{deadline:g} s; retry later, or simplify it (fewer or shallower anyOf/oneOf/allOf "
            "branches, smaller enums or alternations)",
            code="compile_timeout",
            retry_after_s=max(1, math.ceil(deadline)),
        )

    def worker_pids(self) -> list[int]:
        return self._pool.pids() if self._pool else []

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

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
