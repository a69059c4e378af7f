"""DaemonThreads: run calls on daemon threads, growing the pool instead of queueing.

Compiles that pass their deadline in thread mode are abandoned, not stopped: their thread keeps
running until the backend gives up (llguidance bounds its own work). A fixed-size pool would let
a few such stragglers delay every later compile, so a call never waits behind a busy thread:
an idle thread takes it, or a new one is started (up to ``max_threads``). The threads are
daemons so that a straggler never holds up interpreter exit.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class DaemonThreads:
    """A minimal executor: ``submit(fn, *args) -> Future``."""

    def __init__(self, name: str, max_threads: int = 64) -> None:
        self._name = name
        self._max = max_threads
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work and not yet promised to a submitted call
        self._count = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._idle:
                self._idle -= 1  # promise this call to an idle thread
            elif self._count < self._max:
                self._count += 1
                threading.Thread(
                    target=self._run, name=f"{self._name}-{self._count}", daemon=True
                ).start()
            # else: every thread is busy and the cap is reached; the call waits its turn
        self._queue.put((fut, fn, args))
        return fut

    def _run(self) -> None:
        while True:
            fut, fn, args = self._queue.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # handed to whoever waits on the future
                    fut.set_exception(e)
            del fut, fn, args  # drop references before idling
            with self._lock:
                self._idle += 1


class SerialQueue:
    """Runs calls one at a time, in order, on one daemon thread; ``flush`` waits for them.

    The cache writes entries to disk this way, so that a compile's caller never waits for the
    file system (nor for the occasional directory scan that eviction needs).

    ``gate``, when given, is asked before each call with the call's submission time
    (``time.monotonic()``) and answers how many seconds the call should still wait (0 or less:
    run it now). A gated queue does not wake its thread on ``submit`` either: the thread looks
    for work every ``poll_s`` seconds (backing off to 1 s while the queue stays empty), so that
    a submit never hands the GIL to the writer while the caller still has work to do. ``flush``
    overrides the gate: everything pending runs at once.
    """

    def __init__(
        self, name: str, gate: Callable[[float], float] | None = None, poll_s: float = 0.05
    ) -> None:
        self._name = name
        self._gate = gate
        self._poll_s = poll_s
        self._items: deque[tuple[float, Callable[..., Any], tuple]] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._flushing = 0
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            self._pending += 1
            self._items.append((time.monotonic(), fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._gate is None:
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted call has run; False if ``timeout`` passed first."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: self._pending == 0, timeout)
            finally:
                self._flushing -= 1

    def _next(self) -> tuple[Callable[..., Any], tuple]:
        """The next call once it may run (called with the condition held)."""
        idle_wait = self._poll_s
        while True:
            if not self._items:
                if self._gate is None:
                    self._cond.wait()
                else:
                    self._cond.wait(idle_wait)
                    idle_wait = min(1.0, idle_wait * 2)
                continue
            idle_wait = self._poll_s
            wait = 0.0 if self._gate is None or self._flushing else self._gate(self._items[0][0])
            if wait <= 0:
                _, fn, args = self._items.popleft()
                return fn, args
            self._cond.wait(min(wait, self._poll_s))  # the gate's answer may change sooner

    def _run(self) -> None:
        while True:
            with self._cond:
                fn, args = self._next()
            try:
                fn(*args)
            except Exception:  # a bug: report it, keep serving later calls
                logging.getLogger(__name__).exception("%s: background call failed", self._name)
            finally:
                del fn, args
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()


def weak_gate(method: Callable[[float], float]) -> Callable[[float], float]:
    """``method`` as a :class:`SerialQueue` gate that holds no strong reference to its object
    (the queue's thread outlives it); 0 (run now) once the object is gone."""
    ref = weakref.WeakMethod(method)

    def gate(submitted: float) -> float:
        live = ref()
        return live(submitted) if live is not None else 0.0

    return gate
