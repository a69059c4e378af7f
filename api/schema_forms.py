"""Schema forms: a request's JSON schema as sent, mapped to what the server derives from it.

Every ``json_schema`` response format is measured against the request limits
(``limits.schema_stats``), has its objects closed (``grammar.schema_close``) and is canonicalised
into a ``ConstraintSpec``: about 7 ms per 100 kB of schema before the cache lookup, on every
request, hit or miss. All three are pure functions of the schema as sent and of the flags that
shape it (strict, closed objects, whitespace layout), so a server remembers them by the
schema's *form*: the sha256 of its JSON text as ``json.dumps`` writes it (about 0.7 ms per
100 kB). A form with other key order or spacing is another form, derived again: never wrong,
only slower.

Across replicas: a spec's forms are published beside its compiled entry (``describe``, read by
the compile service when it publishes), and a replica that prefetches the entry learns them
(``seed``). The first request for the schema on that replica then skips the derivation as well
as the compile. What Redis returns is trusted as its entries are: the published forms are
sealed under the fleet's key like the entry (``schema_cache.sealing``; a forged or altered one
is rejected before it gets here), and a seeded form is taken only for the spec digest it was
announced with, and only in the shape ``describe`` writes.

Bounded: at most ``MAX_BYTES`` of spec text (least recently used first out); the limits and
the derivation never run on a form twice while it is remembered.

Owned: a server's ``SchemaForms`` is its ``ServerState.forms``, passed to the request path
(``request_constraint``, ``limits``, ``response_formats``), to its compile service's publish
and prefetch hooks and to its metrics; never a module global, so two servers in one process
(replicas, tests) keep their own.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import astuple
from typing import Any

from corral.api.schema_stats import SchemaStats, schema_stats
from corral.grammar import ConstraintSpec

MAX_BYTES = 64 << 20  # spec text remembered, all forms together
MAX_STATS = 4096  # schema forms whose stats are remembered
_FORMS_FIELD = "forms"  # in the JSON published beside an entry (``schema_cache.prefetch``)

#: (schema form, strict, closed objects, flexible whitespace): what a spec is derived from.
SpecKey = tuple[str | None, bool, bool, bool]


def form_of(schema: dict[str, Any] | bool) -> str | None:
    """The schema's form: hex sha256 of its JSON text (key order and values as sent); None for
    a schema nested too deep for ``json.dumps`` (the limits refuse it, measured without one)."""
    try:
        text = json.dumps(schema, check_circular=False, separators=(",", ":"))
    except RecursionError:
        return None
    return hashlib.sha256(text.encode()).hexdigest()


class SchemaForms:
    """Stats and specs remembered by schema form; thread-safe (requests derive on threads)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._stats: dict[str, SchemaStats] = {}
        self._specs: OrderedDict[SpecKey, tuple[ConstraintSpec, bool]] = OrderedDict()
        self._bytes = 0
        self.counts = {"derived": 0, "remembered": 0, "seeded": 0}  # written under the lock

    def snapshot(self) -> dict[str, int]:
        """``counts`` as of now (the metrics read them)."""
        with self._lock:
            return dict(self.counts)

    def stats(self, form: str | None, schema: dict[str, Any] | bool) -> SchemaStats:
        """``schema_stats(schema)``, measured once per remembered form (every time without one)."""
        if form is None:
            return schema_stats(schema)
        with self._lock:
            found = self._stats.get(form)
        if found is None:
            found = schema_stats(schema)
            with self._lock:
                self._stats[form] = found
                self._trim()
        return found

    def spec(self, key: SpecKey) -> tuple[ConstraintSpec, bool] | None:
        """The spec derived for ``key`` and whether closing narrowed it; None if not known."""
        if key[0] is None:
            return None
        with self._lock:
            found = self._specs.get(key)
            if found is not None:
                self._specs.move_to_end(key)
                self.counts["remembered"] += 1
            return found

    def remember(self, key: SpecKey, spec: ConstraintSpec, narrowed: bool) -> None:
        if key[0] is None:
            return
        with self._lock:
            self.counts["derived"] += 1
            self._put(key, spec, narrowed)

    def describe(self, spec: ConstraintSpec) -> dict[str, Any]:
        """What to publish beside ``spec``'s entry: its remembered forms, with their stats."""
        with self._lock:
            forms = [
                [*key, narrowed, list(astuple(self._stats[key[0]]))]
                for key, (known, narrowed) in self._specs.items()
                if known.digest == spec.digest and key[0] in self._stats
            ]
        return {_FORMS_FIELD: forms} if forms else {}

    def seed(self, spec: ConstraintSpec, published: dict[str, Any]) -> None:
        """Remember the forms another replica published for ``spec`` (already checked to be
        the announced constraint); anything not in :meth:`describe`'s shape is ignored."""
        for item in published.get(_FORMS_FIELD, ()):
            parsed = _parse_form(item)
            if parsed is None:
                continue
            key, narrowed, stats = parsed
            with self._lock:
                if key in self._specs:
                    continue
                self.counts["seeded"] += 1
                self._stats.setdefault(key[0], stats)
                self._put(key, spec, narrowed)

    def _put(self, key: SpecKey, spec: ConstraintSpec, narrowed: bool) -> None:
        old = self._specs.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0].source)
        self._specs[key] = (spec, narrowed)
        self._bytes += len(spec.source)
        self._trim()

    def _trim(self) -> None:
        while self._bytes > self._max_bytes and self._specs:
            _, (spec, _) = self._specs.popitem(last=False)
            self._bytes -= len(spec.source)
        while len(self._stats) > MAX_STATS:
            del self._stats[next(iter(self._stats))]


def _parse_form(item: Any) -> tuple[SpecKey, bool, SchemaStats] | None:
    try:
        form, strict, closed, flexible, narrowed, (size, depth, deepest, props, enums) = item
        flags = (strict, closed, flexible, narrowed)
        numbers = (size, depth, props, enums)
        if not (isinstance(form, str) and len(form) == 64 and all(type(f) is bool for f in flags)):
            return None
        if not all(type(n) is int and n >= 0 for n in numbers) or not isinstance(deepest, list):
            return None
        if not all(type(p) in (str, int) for p in deepest):
            return None
    except (TypeError, ValueError):
        return None
    stats = SchemaStats(size, depth, tuple(deepest), props, enums)
    return (form, strict, closed, flexible), narrowed, stats
