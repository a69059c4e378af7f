"""ServerState: everything a running server holds (kept in ``app.state``, never in a global).

What the server remembers across requests is owned here: its constraint runtime (``runtime``:
the tokenizer's token bytes and indexes, the budget closers) and its schema forms (``forms``).
Handlers reach them through the state they are given; two servers in one process (fleet
replicas, tests) share none of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from corral.api.config import ServerConfig
from corral.api.errors import queue_full
from corral.api.metrics import ServerMetrics, StatsFn
from corral.api.prompting import ChatFormatter
from corral.api.response_formats import CompileFn
from corral.api.schema_forms import SchemaForms
from corral.grammar.core.runtime import ConstraintRuntime


class Admission:
    """Bounds the requests in flight: ``max_concurrent`` run, ``queue_limit`` more may wait.

    Beyond that a request is refused at once with a 429 and ``Retry-After`` rather than queued
    without bound (which would only turn into client timeouts).
    """

    def __init__(self, max_concurrent: int, queue_limit: int, retry_after_s: int = 1) -> None:
        self.limit = max_concurrent + queue_limit
        self.retry_after_s = retry_after_s
        self._in_flight = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        """Admit one request or raise the 429 ``ApiError``; pair with :meth:`leave`."""
        with self._lock:
            if self._in_flight >= self.limit:
                raise queue_full(self.retry_after_s)
            self._in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @contextmanager
    def slot(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def stats(self) -> dict[str, int]:
        with self._lock:
            n = self._in_flight
        return {"in_flight": n}


@dataclass
class ServerState:
    """The served model and the services around it.

    ``engine`` is a started-on-lifespan ``AsyncEngine``; ``compile_fn`` awaits a compiled
    constraint's ``Lookup`` (raising ``ConstraintError``); ``degraded`` names the parts that do not work
    now though the server still serves (``/health``: a Redis cache tier that is down). Prompt + max_tokens must fit both the model's
    ``context_length`` and the KV cache's ``kv_capacity`` (tokens). ``runtime`` is the
    constraint runtime of the served tokenizer (its ``tokenizer.hf_tokenizer`` is
    ``tokenizer``); ``forms`` the schema forms this server derived or was seeded with.
    """

    config: ServerConfig
    model_name: str
    context_length: int
    kv_capacity: int
    tokenizer: Any
    engine: Any
    compile_fn: CompileFn
    compile_stats: StatsFn
    runtime: ConstraintRuntime
    forms: SchemaForms = field(default_factory=SchemaForms)
    formatter: ChatFormatter = field(init=False)
    admission: Admission = field(init=False)
    metrics: ServerMetrics = field(init=False)
    created: int = 0
    chat_template: str | None = None
    extra_shutdown: list[Any] = field(default_factory=list)
    degraded: Callable[[], dict[str, str]] = field(default=lambda: {})

    def __post_init__(self) -> None:
        self.formatter = ChatFormatter(
            self.tokenizer,
            self.chat_template,
            self.config.tool_call_format,
            self.config.reasoning_format,
        )
        self.admission = Admission(self.config.max_concurrent, self.config.queue_limit)
        self.metrics = ServerMetrics(
            self.engine.stats, self.compile_stats, self.admission.stats, self.forms.snapshot
        )
