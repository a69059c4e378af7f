"""Worker processes that contain crashes and hangs of native engine code.

Each worker (a :class:`corral.base.supervisor.Worker` running :mod:`corral.fuzz.worker`) fuzzes one
case at a time. The pool waits at most ``stage_timeout`` seconds for the worker's next message;
silence past that is a hang, a closed pipe is a crash. Either way the worker is killed and
replaced, the stage it was in names the guilty target, and the case is run again without that
target, so one bad engine does not hide what the others do.
"""

from __future__ import annotations

import functools
import pickle
import queue
import sys
import threading
import time
from typing import Any

from corral.base.supervisor import DeadlineExceeded, Worker, WorkerFailed
from corral.fuzz import case as K
from corral.fuzz.case import Case, CaseResult, TargetOutcome
from corral.fuzz.judge import schema_keywords
from corral.fuzz.worker import TokenizerSpec, WorkerSpec

STARTUP_TIMEOUT_S = 600.0  # building a 128K tokenizer's tables takes seconds on a busy machine
ABORTED = "aborted"  # the note of a case stopped because the run's time was up
_ABORT_POLL_S = 1.0  # how often a wait for the worker looks at the abort event


class _Aborted(Exception):
    """The run's time is up: the case in flight is dropped."""


class CaseWorker:
    """One supervised worker process that runs a case and names the stage it crashed or hung
    in; a new process starts on the next case after a crash or hang."""

    def __init__(self, spec: WorkerSpec, stage_timeout: float, abort: threading.Event) -> None:
        self.worker = Worker(
            "corral.fuzz.worker",
            label="fuzz worker",
            init=[pickle.dumps(spec)],
            start_timeout_s=STARTUP_TIMEOUT_S,
        )
        self._timeout = stage_timeout
        self._shrink_s = spec.case.shrink_seconds
        self._abort = abort

    def run(self, case: Case, names: list[str], skip_draws: bool) -> tuple[str, Any, str]:
        """``("done", CaseResult, stage)``, ``("bug", traceback, stage)``, or ``("crash" |
        "hang", detail, stage)`` where ``stage`` is the last stage the worker announced.
        WorkerFailed when no worker could be started."""
        self.worker.wait_ready()
        stage = "start"
        try:
            self.worker.send(pickle.dumps((case, names, skip_draws)))
            while True:
                limit = self._timeout + (self._shrink_s if "shrink" in stage else 0)
                kind, payload = self._next_message(limit)
                if kind != "stage":
                    return kind, payload, stage
                stage = payload
        except _Aborted:
            outcome: tuple[str, Any] = ABORTED, ""
        except DeadlineExceeded:
            outcome = K.HANG, f"no progress for {limit:.0f} s"
        except WorkerFailed as e:
            outcome = K.CRASH, str(e)
        self.worker.kill()
        return *outcome, stage

    def _next_message(self, limit: float) -> tuple[str, Any]:
        """The worker's next message within ``limit`` seconds; the abort event is looked at
        every second meanwhile."""
        deadline = time.monotonic() + limit
        while not self._abort.is_set():
            try:
                return pickle.loads(
                    self.worker.recv(min(deadline, time.monotonic() + _ABORT_POLL_S))
                )
            except DeadlineExceeded:
                if time.monotonic() >= deadline:
                    raise
        raise _Aborted


class WorkerPool:
    """``jobs`` workers; :meth:`run_case` is thread-safe and blocks until the case is done."""

    def __init__(self, jobs: int, spec: WorkerSpec, stage_timeout: float) -> None:
        self._spec = spec
        self._abort = threading.Event()
        self._workers = [CaseWorker(spec, stage_timeout, self._abort) for _ in range(max(1, jobs))]
        for w in self._workers:  # start them all, then wait: the start-ups overlap
            w.worker.start()
        self._idle: queue.Queue[CaseWorker] = queue.Queue()
        for w in self._workers:
            w.worker.wait_ready()
            self._idle.put(w)

    def run_case(self, case: Case) -> CaseResult:
        w = self._idle.get()
        try:
            return self._run_on(w, case)
        finally:
            self._idle.put(w)

    def _run_on(self, w: CaseWorker, case: Case) -> CaseResult:
        names, lost, skip_draws = list(self._spec.targets), {}, False
        while True:
            kind, payload, stage = w.run(case, names, skip_draws)
            if kind == ABORTED or self._abort.is_set():
                return CaseResult(case.id, case.source, judged=False, note=ABORTED)
            if kind == "done":
                result: CaseResult = payload
                break
            if kind == "bug":
                print(f"corral fuzz: internal error on {case.id}:\n{payload}", file=sys.stderr)
                result = CaseResult(case.id, case.source, judged=False, note="fuzzer error")
                break
            step, _, target = stage.partition(":")
            if target in names:
                names.remove(target)
                lost[target] = (kind, f"{payload} during {step}")
            elif step == "draw" and not skip_draws:
                skip_draws = True  # instance drawing (hypothesis) stalled: retry without it
            else:
                result = CaseResult(case.id, case.source, judged=False, note=f"{kind}: {payload}")
                break
        for target, (kind, detail) in lost.items():
            keywords = tuple(sorted(schema_keywords(case.schema)))
            out = TargetOutcome(target, status=kind, reason=detail)
            f = case.failure(target, kind, None, detail)
            f.keywords = keywords
            out.failures.append(f)
            result.outcomes[target] = out
        return result

    def abort(self) -> None:
        """Stop the cases in flight within about a second (their results say ``aborted``)."""
        self._abort.set()

    def close(self) -> None:
        for w in self._workers:
            w.worker.close(grace_s=5)


@functools.lru_cache(maxsize=2)
def _tokenizer_view(spec: TokenizerSpec) -> Any:
    from corral.fuzz.probe import TokenView

    return TokenView(spec.build())


class InlinePool:
    """``--jobs 0``: cases run in this process, one at a time, with no crash or hang containment.
    For debugging and for tests; the tokenizer is built once per process and reused."""

    def __init__(self, spec: WorkerSpec) -> None:
        from corral.fuzz.targets import make_target

        self._spec = spec
        self._view = _tokenizer_view(spec.tokenizer)
        self._targets = [make_target(n, self._view.tok) for n in spec.targets]
        self._lock = threading.Lock()

    def run_case(self, case: Case) -> CaseResult:
        from corral.fuzz.casework import run_case

        with self._lock:
            return run_case(case, self._targets, self._view, self._spec.case)

    def abort(self) -> None:
        pass  # one case at a time, in this thread: it finishes

    def close(self) -> None:
        pass


def make_pool(jobs: int, spec: WorkerSpec, stage_timeout: float) -> WorkerPool | InlinePool:
    """Supervised worker processes, or in-process execution when ``jobs`` is 0."""
    return InlinePool(spec) if jobs <= 0 else WorkerPool(jobs, spec, stage_timeout)
