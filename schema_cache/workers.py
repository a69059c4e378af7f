"""WorkerPool: compiles in killable child processes, for compiles that may run away.

A compile in native code cannot be interrupted from Python, and llguidance's JSON-schema
conversion even holds the GIL while it runs, so only a separate process gives a hard deadline.
Each worker is ``python -m corral.schema_cache.worker_main`` (a plain subprocess, so the
parent's ``__main__`` is never re-imported), which builds the tokenizer once and then answers
compile requests over its stdin/stdout. Nothing crosses the pipes as a pickle: requests and
reply headers are JSON, a compiled constraint comes back as ``CompiledConstraint.to_bytes()``.
A worker that passes the deadline is killed and reaped, and a fresh one is started in its place;
so is one that dies, and one whose compile nobody waits for any more (a cancelled flight).

The worker never imports from the server's working directory: it runs with ``-P`` (no script
or current directory prepended to ``sys.path``) and with empty or relative ``PYTHONPATH`` entries
made absolute or dropped, so a stray ``lark.py`` beside the server cannot shadow a package.
"""

from __future__ import annotations

import json
import os
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

from corral.grammar import (
    ConstraintError,
    ConstraintKind,
    ConstraintSpec,
    JsonFormat,
    TokenizerInfo,
)
from corral.schema_cache.flights import CompileCancelled, Flight
from corral.schema_cache.stats import CacheStats

_LEN = struct.Struct("<I")


class DeadlineExceeded(Exception):
    """The compile ran past its deadline; its worker has been killed."""


class WorkerFailed(RuntimeError):
    """A worker died or could not start: the compile could not be finished (not the client's
    mistake, and not a bug in the compile either)."""


_ACQUIRE_POLL_S = 0.05  # how often a compile waiting for a free worker looks for cancellation


def _cancelled(flight: Flight | None) -> bool:
    return flight is not None and flight.is_cancelled()


def worker_command() -> list[str]:
    """The worker's command line: ``-P`` keeps the current directory off its ``sys.path``."""
    return [sys.executable, "-P", "-m", "corral.schema_cache.worker_main"]


def worker_env() -> dict[str, str]:
    """The environment for a worker: ours, with ``PYTHONPATH``'s entries made absolute and its
    empty ones (which would mean the current directory) dropped."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    if path is not None:
        entries = [os.path.abspath(p) for p in path.split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(entries)
    env["PYTHONSAFEPATH"] = "1"
    return env


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame (a 4-byte little-endian length, then the bytes), or None at end of stream."""
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack(head)
    body = stream.read(n)
    return body if len(body) == n else None


def write_frame(stream: BinaryIO, data: bytes) -> None:
    stream.write(_LEN.pack(len(data)) + data)


def spec_to_request(spec: ConstraintSpec) -> dict[str, Any]:
    f = spec.json_format
    return {
        "kind": str(spec.kind),
        "source": spec.source,
        "strict": spec.strict,
        "format": [f.item_separator, f.key_separator, f.flexible, f.max_whitespace],
        "digest": spec.digest,
    }


def spec_from_request(req: dict[str, Any]) -> ConstraintSpec:
    item, key, flexible, max_ws = req["format"]
    fmt = JsonFormat(item, key, flexible, max_ws)
    spec = ConstraintSpec(ConstraintKind(req["kind"]), req["source"], req["strict"], fmt)
    if spec.digest != req["digest"]:
        raise WorkerFailed("the constraint changed on its way to the worker (digest mismatch)")
    return spec


class _Worker:
    """One child process and its pipes. Not thread-safe: the pool lends it to one caller."""

    def __init__(self, tok: TokenizerInfo) -> None:
        self.proc = subprocess.Popen(
            worker_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env=worker_env(),
        )
        self.fingerprint = tok.fingerprint
        self.ready = False
        init = json.dumps({"vocab_size": tok.vocab_size, "eos": list(tok.eos_token_ids)})
        # TokenizerInfo keeps the normalised tokenizer JSON its fingerprint is computed from;
        # sending exactly that text makes the worker's fingerprint match ours. The write runs
        # on a thread: the JSON is larger than a pipe buffer and the child reads it only once
        # its interpreter is up.
        self._sender = threading.Thread(
            target=self._send_init, args=(init.encode(), tok.tokenizer_json.encode()), daemon=True
        )
        self._sender.start()

    def _send_init(self, header: bytes, tokenizer_json: bytes) -> None:
        try:
            write_frame(self.proc.stdin, header)
            write_frame(self.proc.stdin, tokenizer_json)
            self.proc.stdin.flush()
        except OSError:
            pass  # the child died; wait_ready reports it

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float) -> None:
        if self.ready:
            return
        try:
            hello = json.loads(self.read_frame(time.monotonic() + timeout_s))
        except DeadlineExceeded:
            raise WorkerFailed(f"a compile worker did not start within {timeout_s:.0f} s") from None
        if hello.get("ready") != self.fingerprint:
            raise WorkerFailed("a compile worker rebuilt the tokenizer with another fingerprint")
        self.ready = True

    def send(self, data: bytes) -> None:
        try:
            write_frame(self.proc.stdin, data)
            self.proc.stdin.flush()
        except OSError as e:
            raise WorkerFailed(f"a compile worker died (exit code {self.proc.poll()})") from e

    def read_frame(self, deadline: float) -> bytes:
        """One frame; DeadlineExceeded if it is not complete by ``deadline`` (monotonic)."""
        (n,) = _LEN.unpack(self._read_exact(_LEN.size, deadline))
        return self._read_exact(n, deadline)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise DeadlineExceeded
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise WorkerFailed(f"a compile worker died (exit code {self.proc.wait()})")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def signal_kill(self) -> None:
        """Kill the process from another thread; the thread that holds the worker reaps it."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def kill(self) -> None:
        """Kill and reap the process (no zombie, no leak) and close the pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def stop(self) -> None:
        """Close its stdin (which ends the worker's loop), then kill it if it lingers."""
        self._close_pipes()
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class WorkerPool:
    """``size`` worker processes for one tokenizer; ``compile`` blocks at most the deadline.

    Workers start when the pool is made (without waiting for them) and are awaited on first
    use; their start-up time is not part of any compile's deadline.
    """

    def __init__(
        self, tok: TokenizerInfo, size: int, stats: CacheStats, start_timeout_s: float = 120.0
    ) -> None:
        self._tok = tok
        self._stats = stats
        self._start_timeout_s = start_timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(size):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        w = _Worker(self._tok)
        with self._lock:
            self._all.add(w)
        return w

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._all]

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
            flight.on_cancel(w.signal_kill)
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

    def _run(
        self, w: _Worker, spec: ConstraintSpec, deadline_s: float
    ) -> tuple[dict, bytes, float]:
        w.wait_ready(self._start_timeout_s)
        t0 = time.monotonic()
        w.send(json.dumps(spec_to_request(spec)).encode())
        reply = json.loads(w.read_frame(t0 + deadline_s))
        data = w.read_frame(t0 + deadline_s) if reply["status"] == "ok" else b""
        return reply, data, time.monotonic() - t0

    def _acquire(self, flight: Flight | None) -> _Worker:
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

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._stats.inc("worker_restarts")
        with self._lock:
            self._all.discard(w)
            if self._closed:
                return
        self._idle.put(self._spawn())

    def close(self) -> None:
        """Stop every worker, busy or idle, and reap them."""
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.stop()
