"""Prefetch: entries other replicas compile, loaded here before a request asks for them.

A Redis hit saves a replica Corral's analysis of a constraint, not the backend's build of it
from the entry (llguidance rebuilds its matcher from the grammar text: most of a compile's
cost, and llguidance cannot serialise a built matcher). So each replica listens to the entries
the others announce as they publish them (``redis_store``) and loads them in the background:
the request that comes later is a memory hit.

* **Low priority**: one load at a time, on one background thread (llguidance builds without
  holding the GIL: the event loop and the engine go on meanwhile). At most ``MAX_BACKLOG``
  announcements wait; later ones are dropped (``prefetch_skipped``): a request loads those.
* **Its own entries only**: the service loads an entry only if the announced key is the one
  it would compute itself for that constraint (same tokenizer, entry format and grammar code);
  any other is ``prefetch_foreign``, never fetched.
* **Single flight**: a load leads its entry's flight like a request's miss, so a request that
  arrives meanwhile waits for it rather than loading the entry again (``service``).
* **Redis down**: the listener stops with the circuit open, and listens again once Redis
  answers. Entries announced meanwhile are not replayed: a request fetches them as before.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from corral.schema_cache.redis_store import RedisStore
from corral.schema_cache.stats import CacheStats

log = logging.getLogger(__name__)

MAX_BACKLOG = 64  # announcements waiting for the loader; later ones are dropped
_STOP_TIMEOUT_S = 5.0  # the listener looks up every redis_store._LISTEN_POLL_S


class Prefetcher:
    """Listens to ``store``'s announcements and calls ``load(key, spec_digest)`` for each one,
    one at a time, on a background thread; :meth:`close` stops both threads."""

    def __init__(
        self,
        store: RedisStore,
        load: Callable[[str, str], None],
        stats: CacheStats,
        retry_s: float,
    ) -> None:
        self._store = store
        self._load = load
        self._stats = stats
        self._retry_s = retry_s
        self._backlog: queue.Queue[tuple[str, str] | None] = queue.Queue(MAX_BACKLOG)
        self._stopped = threading.Event()
        self._listener = threading.Thread(
            target=self._listen, name="corral-prefetch-listen", daemon=True
        )
        self._loader = threading.Thread(target=self._run, name="corral-prefetch", daemon=True)
        self._listener.start()
        self._loader.start()

    def close(self) -> None:
        """Stop listening and drop the announcements not loaded yet (a load running finishes in
        the background). Returns once the listener is done with its connection."""
        self._stopped.set()
        self._listener.join(timeout=_STOP_TIMEOUT_S)
        while True:
            try:
                self._backlog.get_nowait()
            except queue.Empty:
                break
        self._backlog.put(None)  # wakes the loader up to stop

    def _listen(self) -> None:
        while not self._stopped.is_set():
            if self._store.down() is None:
                self._store.listen(self._queue, self._stopped)
            self._stopped.wait(self._retry_s)  # the store PINGs meanwhile (``redis_store``)

    def _queue(self, key: str, spec_digest: str) -> None:
        try:
            self._backlog.put_nowait((key, spec_digest))
        except queue.Full:
            self._stats.inc("prefetch_skipped")

    def _run(self) -> None:
        while (item := self._backlog.get()) is not None and not self._stopped.is_set():
            try:
                self._load(*item)
            except Exception:  # a bug: report it, go on with the next announcement
                log.exception("prefetch of compiled constraint %s failed", item[0])
