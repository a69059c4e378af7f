"""One request's run on the engine: timing metrics, and an abort whenever it ends early.

An ``EngineCall`` is admitted (``Admission``) before it is created and releases its place when
``close()`` runs, which handlers do in a ``finally``: on completion, on an error, on a client
disconnect (a cancelled streaming generator) alike. Closing an unfinished call aborts the engine
request, which frees its KV memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from corral.api.responses import new_id
from corral.api.state import ServerState

log = logging.getLogger("corral.api")


class EngineCall:
    """Runs ``engine.generate`` for one request and records its metrics."""

    def __init__(
        self,
        state: ServerState,
        prompt_ids: list[int],
        params: Any,
        constraint: Any,
        *,
        arrival: float,
        request_id: str | None = None,
    ) -> None:
        self.state = state
        self.prompt_ids = prompt_ids
        self.params = params
        self.constraint = constraint
        self.arrival = arrival
        self.request_id = request_id or new_id("req-")
        self.num_prompt_tokens = len(prompt_ids)
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self._open_choices = params.n
        self._last_token_at: dict[int, float] = {}
        self._closed = False

    @property
    def finished(self) -> bool:
        return self._open_choices == 0

    async def outputs(self) -> AsyncIterator[Any]:
        """The engine's outputs, all choices interleaved (``.index`` says which)."""
        m = self.state.metrics
        gen = self.state.engine.generate(
            self.prompt_ids, self.params, self.constraint, request_id=self.request_id
        )
        async for out in gen:
            now = time.monotonic()
            self.num_prompt_tokens = out.num_prompt_tokens
            self.num_cached_tokens = out.num_cached_tokens
            if out.token_ids:
                last = self._last_token_at.get(out.index)
                if last is None:
                    m.ttft.observe(now - self.arrival)
                else:
                    m.itl.observe((now - last) / len(out.token_ids))
                self._last_token_at[out.index] = now
                self.num_output_tokens += len(out.token_ids)
            if out.finish_reason is not None:
                self._open_choices -= 1
            yield out

    async def close(self) -> None:
        """Abort the engine request if unfinished and count its tokens. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.finished:
                self.state.engine.abort(self.request_id)
        finally:
            m = self.state.metrics
            m.prompt_tokens.inc(self.num_prompt_tokens)
            m.completion_tokens.inc(self.num_output_tokens)
            m.cached_tokens.inc(self.num_cached_tokens)


def end_request(state: ServerState, endpoint: str, status: int, arrival: float) -> None:
    """Record an admitted request's outcome and duration and release its admission place.

    ``status`` is how the generation ended (200, 4xx, 499 for a client that left, 500); the
    HTTP status of every request is counted separately by the metrics middleware.
    """
    state.metrics.finished.labels(endpoint=endpoint, outcome=str(status)).inc()
    state.metrics.e2e.observe(time.monotonic() - arrival)
    state.admission.leave()


async def merged(calls: list[EngineCall]) -> AsyncIterator[tuple[int, Any]]:
    """(call number, output) from several calls as they arrive; stops all when closed early."""
    if len(calls) == 1:
        async for out in calls[0].outputs():
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, Any] | Exception | None] = asyncio.Queue()

    async def pump(k: int, call: EngineCall) -> None:
        try:
            async for out in call.outputs():
                await queue.put((k, out))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # handed to the consumer, which re-raises it
            await queue.put(e)
            return
        await queue.put(None)

    tasks = [asyncio.create_task(pump(k, c)) for k, c in enumerate(calls)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()


async def watch_disconnect(request: Any, calls: list[EngineCall], interval_s: float = 0.25) -> None:
    """For non-streaming requests: abort the engine requests when the client goes away."""
    while not all(c.finished for c in calls):
        if await request.is_disconnected():
            for c in calls:
                log.info("client disconnected; aborting %s", c.request_id)
                await c.close()
            return
        await asyncio.sleep(interval_s)
