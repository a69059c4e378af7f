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
* **Ready to use**: a loaded entry is made ready (:func:`make_ready`) before it is served, to
  requests that joined the load too: warmed the way a compile leaves it, and with what the
  server prepares per constraint besides (the budget closer of a JSON schema, the schema forms
  the publisher derived it from: ``service``'s ``prepare``) built from the constraint
  published with the entry (:func:`spec_bytes`), sealed like the entry (``sealing``): one that
  is forged or altered is rejected and nothing is prepared from it.
* **Redis down**: the listener stops with the circuit open, and listens again once Redis
  answers. Entries announced meanwhile are not replayed: a request fetches them as before.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from corral.grammar import CompiledConstraint, ConstraintSpec, TokenizerInfo
from corral.grammar.backends.llg_probe import probe
from corral.grammar.core.spec import ConstraintKind, JsonFormat
from corral.schema_cache.redis_store import RedisStore
from corral.schema_cache.stats import CacheStats

log = logging.getLogger(__name__)

#: What a server builds per prefetched constraint: ``prepare(spec, extra)`` (see ``make_ready``).
Prepare = Callable[[ConstraintSpec, dict[str, Any]], object]

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


def make_ready(
    compiled: CompiledConstraint,
    tok: TokenizerInfo,
    published: Callable[[], bytes | None],
    prepare: Prepare | None,
) -> None:
    """Build what the first request for a loaded entry would otherwise build on its way:

    * the matcher's parts (the distinct-keys token index, once per tokenizer) and the lexer
      states of its first positions, which llguidance builds lazily and shares with every later
      copy of the prototype. A compile leaves them behind (its probe walks those positions); an
      entry loaded from bytes has none. The probe's verdict is not needed: the replica that
      compiled the entry probed it.
    * ``prepare(spec, extra)`` (the API's budget closer, tens of milliseconds for a large
      schema, and the schema forms it learns: ``api.schema_forms``), on the constraint
      published beside the entry (``published()``: its bytes, opened from their seal by the
      service, or None), if it is there and is the entry's own.
    """
    cursor = compiled.matcher().native_cursor()  # None: xgrammar, which builds nothing lazily
    if cursor is not None:
        probe(cursor, tok)
    if prepare is not None:
        found = read_spec(published(), compiled.spec_digest)
        if found is not None:
            prepare(*found)


def spec_bytes(spec: ConstraintSpec, extra: dict[str, Any] | None = None) -> bytes:
    """``spec`` as JSON, published beside its entry for the replicas that prefetch it, with
    ``extra``: what the publishing server says about it besides (``CompileService``'s
    ``describe``), handed to the prefetching server's ``prepare``."""
    f = spec.json_format
    return json.dumps(
        {
            "kind": str(spec.kind),
            "source": spec.source,
            "strict": spec.strict,
            "json_format": [f.item_separator, f.key_separator, f.flexible, f.max_whitespace],
            "reasoning": list(spec.reasoning) if spec.reasoning is not None else None,
            "extra": extra or {},
        }
    ).encode()


def read_spec(data: bytes | None, spec_digest: str) -> tuple[ConstraintSpec, dict] | None:
    """The spec :func:`spec_bytes` wrote and its ``extra`` (``{}`` when there is none or it is
    not an object), or None when there is no spec, it does not parse, or it is not the
    constraint announced (another digest)."""
    if data is None:
        return None
    try:
        d = json.loads(data)
        reasoning = d["reasoning"]
        spec = ConstraintSpec(
            ConstraintKind(d["kind"]),
            d["source"],
            d["strict"] is True,
            JsonFormat(*d["json_format"]),
            (reasoning[0], reasoning[1]) if reasoning is not None else None,
        )
    except (ValueError, KeyError, TypeError, IndexError):  # ConstraintError is a ValueError
        return None
    if spec.digest != spec_digest:
        return None
    extra = d.get("extra")
    return spec, extra if isinstance(extra, dict) else {}


def spec_from_bytes(data: bytes | None, spec_digest: str) -> ConstraintSpec | None:
    """The spec of :func:`read_spec`, without its extra."""
    found = read_spec(data, spec_digest)
    return found[0] if found is not None else None
