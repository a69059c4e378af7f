"""AsyncEngine: the synchronous `Engine` on a background thread, streamed to asyncio callers.

The step loop is CPU-bound, so it runs on its own thread, never on the event loop. Callers talk
to it through a thread-safe inbox (add, abort); outputs come back through one asyncio queue per
request, filled with `loop.call_soon_threadsafe`. The engine thread owns the `Engine`: nothing
else touches it while the loop runs.

    engine = AsyncEngine(loaded_model, EngineConfig(), compile_fn)
    await engine.start()
    async for out in engine.generate(prompt_ids, SamplingParams(...), constraint):
        ...  # out.text / out.token_ids are deltas; out.finish_reason ends each choice
    engine.abort(request_id)       # also done for you when the consumer stops iterating
    await engine.stop()
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from corral.engine.config import EngineConfig
from corral.engine.core import Output, SamplingParams
from corral.engine.engine import Engine

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop failed (a server bug, never a client mistake); requests were aborted."""


class AsyncEngine:
    """A background step loop with `generate` as an async iterator of incremental outputs."""

    def __init__(
        self,
        model: Any,
        config: EngineConfig | None = None,
        compile_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        """`compile_fn(spec) -> CompiledConstraint` (sync, may raise ConstraintError) is what
        `compile` runs off the event loop; `generate` itself takes a compiled constraint."""
        self.engine = Engine(model, config)
        self.compile_fn = compile_fn
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stats: dict[str, float] = self.engine.stats()
        self._error: BaseException | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="corral-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the loop; requests still running end with finish_reason "abort"."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None
        self.engine.close()

    # ---- requests ----------------------------------------------------------------------------

    async def compile(self, spec: Any) -> Any:
        """Run `compile_fn(spec)` on a worker thread (ConstraintError propagates)."""
        if self.compile_fn is None:
            raise RuntimeError("this AsyncEngine was built without a compile_fn")
        return await asyncio.get_running_loop().run_in_executor(None, self.compile_fn, spec)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        constraint: Any = None,
        request_id: str | None = None,
    ) -> AsyncIterator[Output]:
        """Stream a request's outputs until every choice has finished.

        Raises `RequestError` (before the first output) for a client mistake. Leaving the loop
        early (break, cancellation, a disconnected client) aborts the request.
        """
        if self._error is not None:
            raise self._error
        if self._thread is None or self._loop is None:
            raise RuntimeError("call `await engine.start()` before generate()")
        params = params or SamplingParams()
        rid = request_id or uuid.uuid4().hex
        stream: asyncio.Queue = asyncio.Queue()
        accepted = self._loop.create_future()
        self._streams[rid] = stream
        self._inbox.put(("add", rid, list(prompt_ids), params, constraint, accepted))
        self._wake.set()
        remaining = params.n
        try:
            await accepted
            while remaining:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finish_reason is not None:
                    remaining -= 1
                yield item
        finally:
            self._streams.pop(rid, None)
            if remaining and accepted.done() and not accepted.exception():
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        """Abort a request at any point (thread-safe, idempotent)."""
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> dict[str, float]:
        """The engine's figures as of its last step (queue depth, running, kv usage, ...)."""
        return dict(self._stats)

    # ---- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                if not self.engine.has_unfinished():
                    self._wake.wait()
                self._wake.clear()
                self._drain_inbox()
                if self.engine.has_unfinished():
                    self._deliver(self.engine.step())
                    self._stats = self.engine.stats()
        except Exception as e:  # a bug in the loop: fail every stream loudly, never hang
            log.exception("engine loop failed")
            self._error = EngineDeadError(f"the engine loop failed: {e!r}")
            self._fail_all(self._error)
            self._refuse_inbox(self._error)
            return
        self._drain_inbox()
        for seq in self.engine.live_sequences():
            self._deliver(self.engine.abort(seq.request_id))
        self._stats = self.engine.stats()

    def _drain_inbox(self) -> None:
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "abort":
                self._deliver(self.engine.abort(cmd[1]))
                continue
            _, rid, prompt, params, constraint, accepted = cmd
            try:
                self.engine.add_request(prompt, params, constraint, rid)
            except Exception as e:  # RequestError for client mistakes; others are ours
                self._resolve(accepted, e)
                continue
            self._resolve(accepted, None)

    def _resolve(self, fut: asyncio.Future, error: BaseException | None) -> None:
        def settle() -> None:
            if fut.done():
                return
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

        self._loop.call_soon_threadsafe(settle)

    def _deliver(self, outputs: list[Output]) -> None:
        if not outputs:
            return

        def put() -> None:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.put_nowait(out)

        self._loop.call_soon_threadsafe(put)

    def _refuse_inbox(self, error: BaseException) -> None:
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                self._resolve(cmd[-1], error)

    def _fail_all(self, error: BaseException) -> None:
        def put() -> None:
            for stream in self._streams.values():
                stream.put_nowait(error)

        self._loop.call_soon_threadsafe(put)
