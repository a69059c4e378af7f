"""Worker processes that contain crashes and hangs of native engine code.

Each worker fuzzes one case at a time. The supervisor waits at most ``stage_timeout`` seconds for
the worker's next message; silence past that is a hang, a closed pipe is a crash. Either way the
worker is killed and replaced, the stage it was in names the guilty target, and the case is run
again without that target, so one bad engine does not hide what the others do.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from corral.fuzz import case as K
from corral.fuzz.case import Case, CaseResult, TargetOutcome
from corral.fuzz.judge import schema_keywords
from corral.fuzz.worker import TokenizerSpec, WorkerSpec, worker_main

STARTUP_TIMEOUT_S = 600.0  # building a 128K tokenizer's tables takes seconds on a busy machine
ABORTED = "aborted"  # the note of a case stopped because the run's time was up


class WorkerStartError(RuntimeError):
    """A worker process died or stalled before it was ready."""


class Worker:
    """One supervised worker process, started lazily and restarted after a crash or hang."""

    def __init__(self, spec: WorkerSpec, stage_timeout: float, abort: threading.Event) -> None:
        self._spec = spec
        self._timeout = stage_timeout
        self._abort = abort
        self._proc: Any = None
        self._conn: Any = None

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=worker_main, args=(child, self._spec), daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self._kill()
            raise WorkerStartError("a fuzz worker did not start within the time limit")
        try:
            self._conn.recv()
        except EOFError as e:
            code = self._proc.exitcode
            self._kill()
            raise WorkerStartError(f"a fuzz worker died while starting (exit code {code})") from e

    def run(self, case: Case, names: list[str], skip_draws: bool) -> tuple[str, Any, str]:
        """``("done", CaseResult, stage)``, ``("bug", traceback, stage)``, or ``("crash" |
        "hang", detail, stage)`` where ``stage`` is the last stage the worker announced."""
        if self._proc is None:
            self.start()
        self._conn.send((case, names, skip_draws))
        stage = "start"
        while True:
            limit = self._timeout + (self._spec.case.shrink_seconds if "shrink" in stage else 0)
            deadline = time.monotonic() + limit
            while not self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                if self._abort.is_set():
                    self._kill()
                    return ABORTED, "", stage
                if time.monotonic() >= deadline:
                    self._kill()
                    return K.HANG, f"no progress for {limit:.0f} s", stage
            try:
                kind, payload = self._conn.recv()
            except (EOFError, OSError):
                self._proc.join(5)
                detail = f"the worker died (exit code {self._proc.exitcode})"
                self._kill()
                return K.CRASH, detail, stage
            if kind != "stage":
                return kind, payload, stage
            stage = payload

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._conn.send(None)
                self._proc.join(5)
            except OSError:
                pass
            self._kill()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


class WorkerPool:
    """``jobs`` workers; :meth:`run_case` is thread-safe and blocks until the case is done."""

    def __init__(self, jobs: int, spec: WorkerSpec, stage_timeout: float) -> None:
        self._spec = spec
        self._abort = threading.Event()
        self._workers = [Worker(spec, stage_timeout, self._abort) for _ in range(max(1, jobs))]
        with ThreadPoolExecutor(len(self._workers)) as ex:  # start-ups overlap
            list(ex.map(Worker.start, self._workers))
        self._idle: queue.Queue[Worker] = queue.Queue()
        for w in self._workers:
            self._idle.put(w)

    def run_case(self, case: Case) -> CaseResult:
        w = self._idle.get()
        try:
            return self._run_on(w, case)
        finally:
            self._idle.put(w)

    def _run_on(self, w: Worker, case: Case) -> CaseResult:
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
            w.close()


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
