"""Single-flight bookkeeping: one compile per key, who waits for it, and how to stop it.

A :class:`Flight` is one in-flight miss of one entry key. Every caller that wants the key joins
it (the first one leads: it starts the compile) and leaves it when it has its answer or stops
waiting. A caller that stops waiting because its client went away *abandons* the flight; when
the last waiter abandons a flight whose result is not in yet, the flight is cancelled: a compile
running in a worker process is stopped (the worker is killed and replaced) and one still
waiting for a worker is dropped. In-process compiles cannot be stopped; they finish and are
cached as usual.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future


class CompileCancelled(Exception):
    """The compile was stopped because nobody waits for it any more (never cached)."""


class FlightMissed(Exception):
    """The flight ended without an answer (a prefetch found no entry it could load): whoever
    waited for it looks again, and leads a flight of its own."""


class Flight:
    """One in-flight compile: the future of its outcome, its waiters, its cancellation."""

    def __init__(self) -> None:
        self.future: Future = Future()
        self.waiters = 0
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def wait_cancelled(self, timeout: float) -> bool:
        return self._cancelled.wait(timeout)

    def on_cancel(self, stop: Callable[[], None] | None) -> None:
        """Call ``stop`` if the flight is cancelled while it is set (None unsets it); called at
        once when the flight is cancelled already."""
        with self._lock:
            self._stop = stop
            run = stop is not None and self._cancelled.is_set()
        if run:
            stop()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled.set()
            stop = self._stop
        if stop is not None:
            stop()


class Flights:
    """The flights in progress, by entry key. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, Flight] = {}

    def join(self, key: str) -> tuple[Flight, bool]:
        """The flight of ``key`` with one more waiter, and whether the caller must lead it."""
        with self._lock:
            flight = self._by_key.get(key)
            leader = flight is None or flight.is_cancelled()
            if leader:
                flight = self._by_key[key] = Flight()
            flight.waiters += 1
            return flight, leader

    def leave(self, flight: Flight, *, abandon: bool = False) -> None:
        """One waiter less; ``abandon``: it gave up (its client left), which cancels the flight
        when it was the last waiter and the outcome is not in yet."""
        with self._lock:
            flight.waiters -= 1
            cancel = abandon and flight.waiters == 0 and not flight.future.done()
        if cancel:
            flight.cancel()

    def finish(self, key: str, flight: Flight) -> None:
        """Forget ``flight`` (its outcome is set); a later miss of ``key`` starts a new one."""
        with self._lock:
            if self._by_key.get(key) is flight:
                del self._by_key[key]

    def busy(self) -> bool:
        return bool(self._by_key)


def bridge(source: Future) -> asyncio.Future:
    """An asyncio future that follows ``source`` but whose cancellation does not cancel it
    (``asyncio.wrap_future`` would cancel the shared flight for every waiter)."""
    loop = asyncio.get_running_loop()
    target = loop.create_future()

    def copy(done: Future) -> None:
        if target.done():
            return
        error = done.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    def hand_over(done: Future) -> None:
        try:
            loop.call_soon_threadsafe(copy, done)
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is left to tell

    source.add_done_callback(hand_over)
    return target
