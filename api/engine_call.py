"""One request's run on the engine: its admission place, timing metrics, how it ended, and an
abort whenever it ends early.

A request is admitted (``Admitted``, a 429 when full) before anything costly runs (compiles,
tokenization); its place is released exactly once by ``Admitted.end`` on every path: completion,
an error, a client that left (a cancelled stream, a response never started). An ``EngineCall``
runs one engine request; closing an unfinished call aborts it, which frees its KV memory. A
choice that ends in failure (engine finish "error" or "abort") is raised from ``outputs()`` as
``GenerationFailed`` (see ``outcomes``), counted and logged there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi.responses import StreamingResponse

from corral.api.errors import ApiError, error_events, status_of, unavailable
from corral.api.outcomes import failure, record_failure
from corral.api.response_formats import compile_or_400
from corral.api.responses import new_id
from corral.api.sse import DONE
from corral.api.state import ServerState
from corral.grammar import ConstraintError

log = logging.getLogger("corral.api")
T = TypeVar("T")
CLIENT_LEFT = 499  # nginx's "client closed request": the outcome of a request whose client left


class Admitted:
    """A request's place in ``Admission`` (taken on construction: a 429 when full) and the
    record of its outcome; ``end(status)`` counts the outcome and frees the place, once.

    Used as ``with Admitted(...) as admitted:`` around a handler: leaving the block ends the
    request with the status its exception maps to (200 without one), unless the handler handed
    the request to a stream (:meth:`stream`), which then ends it.
    """

    def __init__(self, state: ServerState, endpoint: str, arrival: float) -> None:
        state.admission.enter()
        self.state, self.endpoint, self.arrival = state, endpoint, arrival
        self._ended = self._streaming = False

    def __enter__(self) -> Admitted:
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> None:
        if self._streaming:
            return
        if exc is None:
            self.end(200)
        else:
            cancelled = isinstance(exc, asyncio.CancelledError)
            self.end(CLIENT_LEFT if cancelled else status_of(exc))

    def end(self, status: int) -> None:
        """``status``: how the generation ended (200, 4xx, 499 for a client that left, 5xx)."""
        if self._ended:
            return
        self._ended = True
        m = self.state.metrics
        m.finished.labels(endpoint=self.endpoint, outcome=str(status)).inc()
        m.e2e.observe(time.monotonic() - self.arrival)
        self.state.admission.leave()

    def stream(self, events: AsyncIterator[str], calls: list[EngineCall]) -> GuardedStream:
        """Hand the request to an SSE stream whose generator calls :meth:`end` when it ends.
        If the client leaves before the stream starts, the calls are closed and the request
        ends as 499 all the same."""
        self._streaming = True

        async def on_close() -> None:
            await close_all(calls)
            self.end(CLIENT_LEFT)  # a no-op when the stream ended it

        return GuardedStream(events, on_close)


def require_engine(state: ServerState) -> None:
    """503 ``engine_unavailable`` (with Retry-After) unless the engine can serve now: a stream
    gets it as its status, before the first byte, rather than as an error event."""
    health = state.engine.health()
    if health != "ok":
        raise unavailable(
            f"the engine cannot take requests now ({health})", "engine_unavailable", 1
        )


class ClientGone(ApiError):
    """The client disconnected before its answer was ready (nobody reads this 499)."""

    def __init__(self) -> None:
        super().__init__(CLIENT_LEFT, "the client closed the request", code="client_closed")


async def unless_disconnected(request: Any, work: Awaitable[T], interval_s: float = 0.1) -> T:
    """Await ``work`` (e.g. a compile); if the client disconnects first, cancel it and raise
    ``ClientGone``, so nobody computes an answer that no one will read."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                log.info("client disconnected while its request was being prepared")
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()


async def compile_for(
    state: ServerState,
    request: Any,
    spec: Any,
    on_error: Callable[[ConstraintError], ApiError],
) -> Any:
    """The compiled constraint of an admitted request, as the compile service's ``Lookup``
    (where it came from; a ConstraintError becomes ``on_error``'s 400); abandoned, and the
    compile cancelled, if the client disconnects meanwhile."""
    return await unless_disconnected(request, compile_or_400(state.compile_fn, spec, on_error))


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
        self._spec: dict[int, tuple[int, int]] = {}  # choice -> lookup tokens proposed, accepted
        self._open_choices = params.n
        self._last_token_at: dict[int, float] = {}
        self._closed = False

    @property
    def finished(self) -> bool:
        return self._open_choices == 0

    async def outputs(self) -> AsyncIterator[Any]:
        """The engine's outputs, all choices interleaved (``.index`` says which).

        Raises ``GenerationFailed`` for a choice that failed, before any of its output is
        shown: the request fails as a whole, never as a truncated success.
        """
        gen = self.state.engine.generate(
            self.prompt_ids, self.params, self.constraint, request_id=self.request_id
        )
        async with aclosing(gen):  # closing it aborts the engine request's other choices
            async for out in gen:
                self._observe(out)
                failed = failure(out)
                if failed is not None and self._closed:
                    raise ClientGone()  # we aborted it: the client left, nothing failed
                if failed is not None:
                    record_failure(self.state.metrics, self.request_id, failed)
                    raise failed
                yield out

    def _observe(self, out: Any) -> None:
        now = time.monotonic()
        m = self.state.metrics
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
        if out.spec_proposed:
            self._spec[out.index] = (out.spec_proposed, out.spec_accepted)
        if out.finish_reason is not None:
            self._open_choices -= 1

    @property
    def spec_proposed(self) -> int:
        """Lookup draft tokens proposed for this call's choices so far."""
        return sum(p for p, _ in self._spec.values())

    @property
    def spec_accepted(self) -> int:
        return sum(a for _, a in self._spec.values())

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


async def framed_stream(
    events: AsyncIterator[str], close: Callable[[], Awaitable[None]], admitted: Admitted
) -> AsyncIterator[str]:
    """One endpoint's stream as every endpoint ends it: ``events``, then ``[DONE]``; a failure
    after the first byte as an error event, then ``[DONE]`` (never a silent end); ``close``
    (the engine calls) and ``admitted.end`` with the outcome always, a client that left
    counted as ``CLIENT_LEFT``."""
    status = CLIENT_LEFT  # unless the stream reaches its end
    try:
        async with aclosing(events) as each:  # closed here even when the client leaves
            async for event in each:
                yield event
        yield DONE
        status = 200
    except Exception as e:  # after the first byte: an error event, then [DONE]
        status = status_of(e)
        for event in error_events(e):
            yield event
    finally:
        await close()
        admitted.end(status)


async def close_all(calls: list[EngineCall]) -> None:
    for c in calls:
        await c.close()


class GuardedStream(StreamingResponse):
    """A server-sent-event stream that always runs ``on_close`` when the response is over.

    The stream's own generator releases what it holds in its ``finally``, but a generator that
    was never started (the client left before the first byte) never runs it: ``on_close`` does.
    """

    def __init__(
        self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.on_close()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
