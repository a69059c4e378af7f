"""AsyncEngine: the synchronous `Engine` on a background thread, streamed to asyncio callers.

The step loop is CPU-bound, so it runs on its own thread, never on the event loop. Callers talk
to it through a thread-safe inbox (add, abort); outputs come back through one asyncio queue per
request, filled with `loop.call_soon_threadsafe`. The engine thread owns the `Engine`: nothing
else touches it while the loop runs.

    engine = AsyncEngine(loaded_model, EngineConfig(), compile_fn, tokenizer_fingerprint)
    await engine.start()
    async for out in engine.generate(prompt_ids, SamplingParams(...), constraint):
        ...  # out.text / out.token_ids are deltas; out.finish_reason ends each choice
    engine.abort(request_id)       # also done for you when the consumer stops iterating
    await engine.stop()

Failures. A failure tied to one sequence ends that choice with finish reason "error" (see
`Engine`). An exception in the step itself restarts the loop: every request in flight gets a
final `Output` per live choice with finish reason "error" and `EngineFailure("engine_restarted")`,
the engine is reset (everything freed, integrity checked) or, if that fails, rebuilt, and new
requests are served again. `health()` says where it stands: "starting" (not started yet), "ok",
"restarting", "down" (restarting failed `MAX_RESTART_ATTEMPTS` times in a row, or stopped);
`health_log` keeps the last transitions with their `time.monotonic()`. While restarting or down,
`generate` raises `EngineUnavailable` (HTTP 503 with Retry-After).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from corral.engine.serving.config import EngineConfig
from corral.engine.serving.core import EngineFailure, Output, SamplingParams
from corral.engine.serving.engine import Engine

log = logging.getLogger(__name__)

MAX_RESTART_ATTEMPTS = 3
_RESTART_BACKOFF_S = (0.0, 0.2, 1.0)  # before each attempt


class EngineUnavailable(RuntimeError):
    """The engine cannot take requests now (restarting, or down): retry after `retry_after_s`.
    Never a client mistake: the API answers 503 with Retry-After."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineDeadError(EngineUnavailable):
    """The engine is down: its loop failed and could not be restarted (a server bug)."""


class AsyncEngine:
    """A background step loop with `generate` as an async iterator of incremental outputs."""

    def __init__(
        self,
        model: Any,
        config: EngineConfig | None = None,
        compile_fn: Callable[[Any], Any] | None = None,
        tokenizer_fingerprint: str | None = None,
    ) -> None:
        """`compile_fn(spec) -> CompiledConstraint` (sync, may raise ConstraintError) is what
        `compile` runs off the event loop; `generate` itself takes a compiled constraint.
        `tokenizer_fingerprint` (the model tokenizer's): constraints compiled for another
        tokenizer are refused with `RequestError`."""
        self.model = model
        self.config = config
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.engine = Engine(model, config, tokenizer_fingerprint)
        self.compile_fn = compile_fn
        self.restarts = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._health = "starting"
        self.health_log: deque[tuple[float, str]] = deque([(time.monotonic(), "starting")], 64)
        self._stats: dict[str, float] = self.engine.stats()

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="corral-engine", daemon=True)
        self._thread.start()
        self._set_health("ok")

    async def stop(self) -> None:
        """Stop the loop; requests still running end with finish reason "error"
        (`EngineFailure("engine_stopped")`)."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None
        self._set_health("down")
        if self.engine is not None:
            self.engine.close()

    def _set_health(self, state: str) -> None:
        self._health = state
        self.health_log.append((time.monotonic(), state))

    def health(self) -> str:
        """ "starting", "ok", "restarting" or "down" (see the module docstring)."""
        return self._health

    @property
    def ready(self) -> bool:
        """True when the engine can serve (`health() == "ok"`)."""
        return self._health == "ok"

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

        Raises `RequestError` (before the first output) for a client mistake, and
        `EngineUnavailable` while the engine is restarting or down. Leaving the loop early
        (break, cancellation, a disconnected client) aborts the request, also when that happens
        before the engine has taken it in.
        """
        self._check_available()
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
            # Shielded: a cancelled caller must not cancel `accepted`, or the engine thread's
            # answer (added or refused) would be lost and the request would run unobserved.
            await asyncio.shield(accepted)
            while remaining:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finish_reason is not None:
                    remaining -= 1
                yield item
        finally:
            self._streams.pop(rid, None)
            if remaining:
                self._abort_once_added(rid, accepted)

    async def flush_cache(self) -> int:
        """Drop every prefix-cache entry no request holds, on the engine thread between steps;
        returns the tokens freed. Entries locked by running requests stay."""
        self._check_available()
        if self._loop is None:
            raise RuntimeError("call `await engine.start()` before flush_cache()")
        done = self._loop.create_future()
        self._inbox.put(("flush", done))
        self._wake.set()
        return await done

    def abort(self, request_id: str) -> None:
        """Abort a request at any point (thread-safe, idempotent)."""
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> dict[str, float]:
        """The engine's figures as of its last loop turn (queue depth, running, kv usage, ...),
        plus `engine_restarts`."""
        return {**self._stats, "engine_restarts": self.restarts}

    def _check_available(self) -> None:
        if self._health == "restarting":
            raise EngineUnavailable("the engine is restarting after a failure", retry_after_s=1)
        if self._health == "down" and self._thread is not None:
            raise EngineDeadError("the engine is down: it failed and could not be restarted", 30)

    def _abort_once_added(self, rid: str, accepted: asyncio.Future) -> None:
        """Abort `rid` if the engine took it in (now, or once it answers); never when it was
        refused, since the id may then belong to another request."""

        def abort_if_added(fut: asyncio.Future) -> None:
            if not fut.cancelled() and fut.exception() is None:
                self.abort(rid)

        if accepted.done():
            abort_if_added(accepted)
        else:
            accepted.add_done_callback(abort_if_added)

    # ---- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._turn()
            except Exception as e:  # the step itself failed: fail what is in flight, restart
                log.exception("the engine step failed; restarting the engine loop")
                if not self._restart(e):
                    return
        self._shutdown()

    def _turn(self) -> None:
        """One loop turn: wait for work, take in the inbox, run a step."""
        if not self.engine.has_unfinished():
            self._wake.wait()
        self._wake.clear()
        self._drain_inbox()
        outputs = self.engine.step() if self.engine.has_unfinished() else []
        # Refreshed every turn, also after aborts alone (gauges never go stale), and before the
        # outputs go out, so a caller never sees gauges older than its output.
        self._stats = self.engine.stats()
        self._deliver(outputs)

    def _restart(self, error: BaseException) -> bool:
        """Fail every live sequence, then reset (or rebuild) the engine; False when down."""
        self._set_health("restarting")
        self.restarts += 1
        failure = EngineFailure(
            "engine_restarted",
            f"the engine step failed ({type(error).__name__}: {error}); the engine was "
            "restarted and this request was ended; retry it",
        )
        try:
            self._deliver(self.engine.fail_all(failure))
        except Exception:
            log.exception("failing the requests in flight failed")
        for attempt in range(MAX_RESTART_ATTEMPTS):
            time.sleep(_RESTART_BACKOFF_S[attempt])
            try:
                self.engine.reset() if attempt == 0 else self._rebuild()
            except Exception:
                log.exception("engine restart attempt %d failed", attempt + 1)
                continue
            self._stats = self.engine.stats()
            self._set_health("ok")
            return True
        self._die(EngineDeadError("the engine failed and could not be restarted", 30))
        return False

    def _rebuild(self) -> None:
        """A fresh `Engine` (new KV pool, tree, scheduler) on the same model; armed test faults
        carry over, so one that fired does not fire again."""
        old, self.engine = self.engine, None
        faults = old.faults
        try:
            old.close()
        except Exception:
            log.exception("closing the failed engine failed")
        del old
        self.engine = Engine(self.model, self.config, self.tokenizer_fingerprint)
        self.engine.faults = faults

    def _die(self, error: EngineDeadError) -> None:
        self._set_health("down")
        self._fail_streams(error)
        self._refuse_inbox(error)

    def _shutdown(self) -> None:
        self._drain_inbox()
        stopped = EngineFailure("engine_stopped", "the server is shutting down")
        self._deliver(self.engine.fail_all(stopped))
        self._stats = self.engine.stats()

    def _pending(self) -> Iterator[tuple]:
        """The commands waiting in the inbox, taken one at a time without blocking."""
        while True:
            try:
                yield self._inbox.get_nowait()
            except queue.Empty:
                return

    def _drain_inbox(self) -> None:
        for cmd in self._pending():
            if cmd[0] == "abort":
                self._deliver(self.engine.abort(cmd[1]))
                continue
            if cmd[0] == "flush":
                self._resolve(cmd[1], None, self.engine.flush_cache())
                continue
            _, rid, prompt, params, constraint, accepted = cmd
            try:
                self.engine.add_request(prompt, params, constraint, rid)
            except Exception as e:  # RequestError for client mistakes; others are ours
                self._resolve(accepted, e)
                continue
            self._resolve(accepted, None)

    def _resolve(
        self, fut: asyncio.Future, error: BaseException | None, result: Any = None
    ) -> None:
        def settle() -> None:
            if fut.done():
                return
            if error is None:
                fut.set_result(result)
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
        for cmd in self._pending():
            if cmd[0] in ("add", "flush"):
                self._resolve(cmd[-1], error)

    def _fail_streams(self, error: BaseException) -> None:
        def put() -> None:
            for stream in self._streams.values():
                stream.put_nowait(error)

        self._loop.call_soon_threadsafe(put)
