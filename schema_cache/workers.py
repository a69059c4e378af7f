"""WorkerPool: compiles in killable child processes, for compiles that may run away.

A compile in native code cannot be interrupted from Python, and llguidance's JSON-schema
conversion even holds the GIL while it runs, so only a separate process gives a hard deadline.
Each worker is ``python -P -m corral.schema_cache.worker_main``, run by :mod:`corral.base.supervisor`
(which keeps the server's working directory off its ``sys.path``); it builds the tokenizer once
and then answers compile requests. Nothing crosses the pipes as a pickle: requests and reply
headers are JSON, a compiled constraint comes back as ``CompiledConstraint.to_bytes()``.
A worker that passes the deadline is killed and reaped, and a fresh one is started in its place;
so is one that dies, and one whose compile nobody waits for any more (a cancelled flight).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

from corral.base.supervisor import DeadlineExceeded, Worker, WorkerFailed
from corral.grammar import (
    ConstraintError,
    ConstraintKind,
    ConstraintSpec,
    JsonFormat,
    TokenizerInfo,
)
from corral.schema_cache.flights import CompileCancelled, Flight
from corral.schema_cache.stats import CacheStats

_MODULE = "corral.schema_cache.worker_main"
_ACQUIRE_POLL_S = 0.05  # how often a compile waiting for a free worker looks for cancellation


def _cancelled(flight: Flight | None) -> bool:
    return flight is not None and flight.is_cancelled()


def ready_message(tok: TokenizerInfo) -> bytes:
    """What a worker says once it has rebuilt ``tok``: its fingerprint, which must be ours."""
    return json.dumps({"ready": tok.fingerprint}).encode()


def _init_frames(tok: TokenizerInfo) -> list[bytes]:
    """The tokenizer, as a new worker reads it: a JSON header (logits width, EOS ids), then the
    normalised tokenizer JSON that ``tok``'s fingerprint is computed from, so that the worker's
    fingerprint matches ours."""
    header = json.dumps({"vocab_size": tok.vocab_size, "eos": list(tok.eos_token_ids)})
    return [header.encode(), tok.tokenizer_json.encode()]


def spec_to_request(spec: ConstraintSpec) -> dict[str, Any]:
    f = spec.json_format
    return {
        "kind": str(spec.kind),
        "source": spec.source,
        "strict": spec.strict,
        "format": [f.item_separator, f.key_separator, f.flexible, f.max_whitespace],
        "digest": spec.digest,
        "reasoning": list(spec.reasoning) if spec.reasoning is not None else None,
    }


def spec_from_request(req: dict[str, Any]) -> ConstraintSpec:
    item, key, flexible, max_ws = req["format"]
    fmt = JsonFormat(item, key, flexible, max_ws)
    reasoning = tuple(req["reasoning"]) if req.get("reasoning") is not None else None
    spec = ConstraintSpec(
        ConstraintKind(req["kind"]), req["source"], req["strict"], fmt, reasoning=reasoning
    )
    if spec.digest != req["digest"]:
        raise WorkerFailed("the constraint changed on its way to the worker (digest mismatch)")
    return spec


class WorkerPool:
    """``size`` worker processes for one tokenizer; ``compile`` blocks at most the deadline.

    Workers start when the pool is made (without waiting for them) and are awaited on first
    use; their start-up time is not part of any compile's deadline.
    """

    def __init__(
        self, tok: TokenizerInfo, size: int, stats: CacheStats, start_timeout_s: float = 120.0
    ) -> None:
        self._stats = stats
        self._start_timeout_s = start_timeout_s
        init, hello = _init_frames(tok), ready_message(tok)
        self._workers = [
            Worker(
                _MODULE,
                label="compile worker",
                init=init,
                hello=hello,
                start_timeout_s=start_timeout_s,
            )
            for _ in range(size)
        ]
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        for w in self._workers:
            w.start()
            self._idle.put(w)

    def pids(self) -> list[int]:
        return [pid for w in self._workers if (pid := w.pid) is not None]

    def compile(
        self, spec: ConstraintSpec, deadline_s: float, flight: Flight | None = None
    ) -> tuple[bytes, float]:
        """The entry bytes of ``spec`` compiled in a worker, and the seconds it took.

        The deadline (and the time returned) start once a worker is ready, after any start-up.
        ``flight``, when given and cancelled meanwhile, stops the compile: a job still waiting
        for a worker is dropped, a running one's worker is killed (and replaced).

        Raises ConstraintError (the client's mistake), DeadlineExceeded (the worker was killed
        and replaced), WorkerFailed (it died or could not start), CompileCancelled, or
        RuntimeError (the compile failed in the worker: a bug).
        """
        if self._closed:
            raise WorkerFailed("the compile service is closed")
        w = self._acquire(flight)
        if flight is not None:
            flight.on_cancel(w.killer())
        try:
            reply, data, seconds = self._run(w, spec, deadline_s)
        except BaseException as e:
            self._replace(w)
            if isinstance(e, DeadlineExceeded | WorkerFailed) and _cancelled(flight):
                raise CompileCancelled from None
            raise
        finally:
            if flight is not None:
                flight.on_cancel(None)
        if _cancelled(flight):
            self._replace(w)  # a cancellation may have killed it just as the reply came in
        else:
            self._idle.put(w)
        if reply["status"] == "refused":
            raise ConstraintError(
                reply["reason"], reply["pointer"], reply["keyword"], reply.get("limit")
            )
        if reply["status"] == "error":
            raise RuntimeError(
                f"the compile failed in a worker: {reply['type']}: {reply['message']}"
            )
        return data, seconds

    @staticmethod
    def _run(w: Worker, spec: ConstraintSpec, deadline_s: float) -> tuple[dict, bytes, float]:
        w.wait_ready()
        t0 = time.monotonic()
        w.send(json.dumps(spec_to_request(spec)).encode())
        reply = json.loads(w.recv(t0 + deadline_s))
        data = w.recv(t0 + deadline_s) if reply["status"] == "ok" else b""
        return reply, data, time.monotonic() - t0

    def _acquire(self, flight: Flight | None) -> Worker:
        """A free worker (maybe still starting); waits at most the start timeout for one, and
        gives up as soon as ``flight`` is cancelled."""
        give_up = time.monotonic() + self._start_timeout_s
        while True:
            if _cancelled(flight):
                raise CompileCancelled
            left = give_up - time.monotonic()
            if left <= 0:
                raise WorkerFailed(
                    f"no compile worker became free within {self._start_timeout_s:.0f} s"
                )
            try:
                return self._idle.get(timeout=min(left, _ACQUIRE_POLL_S))
            except queue.Empty:
                continue

    def _replace(self, w: Worker) -> None:
        """Kill ``w``'s process and start a fresh one in its place (none once closed)."""
        w.kill()
        self._stats.inc("worker_restarts")
        with self._lock:  # close() either sees the fresh process or prevents it
            if self._closed:
                return
            w.start()
        self._idle.put(w)

    def close(self) -> None:
        """Stop every worker, busy or idle, and reap them."""
        with self._lock:
            self._closed = True
        for w in self._workers:
            w.close()
