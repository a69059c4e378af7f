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
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put((fn, args))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted call has run; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        while True:
            fn, args = self._queue.get()
            try:
                fn(*args)
            except Exception:  # a bug: report it, keep serving later calls
                logging.getLogger(__name__).exception("%s: background call failed", self._name)
            finally:
                del fn, args
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
