"""WorkerPool: compiles in killable child processes, for compiles that may run away.

A compile in native code cannot be interrupted from Python, and llguidance's JSON-schema
conversion even holds the GIL while it runs, so only a separate process gives a hard deadline.
Each worker is ``python -m corral.schema_cache.worker_main`` (a plain subprocess, so the
parent's ``__main__`` is never re-imported), which builds the tokenizer once and then answers
compile requests over its stdin/stdout. Nothing crosses the pipes as a pickle: requests and
reply headers are JSON, a compiled constraint comes back as ``CompiledConstraint.to_bytes()``.
A worker that passes the deadline is killed and reaped, and a fresh one is started in its place.
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
from corral.schema_cache.stats import CacheStats

_LEN = struct.Struct("<I")


class DeadlineExceeded(Exception):
    """The compile ran past its deadline; its worker has been killed."""


class WorkerFailed(RuntimeError):
    """A worker died, could not start, or failed for a reason that is not the client's."""


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
            [sys.executable, "-m", "corral.schema_cache.worker_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
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

    def compile(self, spec: ConstraintSpec, deadline_s: float) -> tuple[bytes, float]:
        """The entry bytes of ``spec`` compiled in a worker, and the seconds it took.

        The deadline (and the time returned) start once a worker is ready, after any start-up.

        Raises ConstraintError (the client's mistake), DeadlineExceeded (the worker was killed
        and replaced) or WorkerFailed.
        """
        if self._closed:
            raise WorkerFailed("the compile service is closed")
        w = self._acquire()
        t0 = time.monotonic()
        deadline = t0 + deadline_s
        try:
            w.send(json.dumps(spec_to_request(spec)).encode())
            reply = json.loads(w.read_frame(deadline))
            data = w.read_frame(deadline) if reply["status"] == "ok" else b""
        except (DeadlineExceeded, WorkerFailed):
            self._replace(w)
            raise
        self._idle.put(w)
        if reply["status"] == "refused":
            raise ConstraintError(reply["reason"], reply["pointer"], reply["keyword"])
        if reply["status"] == "error":
            raise WorkerFailed(
                f"the compile failed in a worker: {reply['type']}: {reply['message']}"
            )
        return data, time.monotonic() - t0

    def _acquire(self) -> _Worker:
        t0 = time.monotonic()
        try:
            w = self._idle.get(timeout=self._start_timeout_s)
        except queue.Empty:
            raise WorkerFailed(
                f"no compile worker became free within {self._start_timeout_s:.0f} s"
            ) from None
        try:
            w.wait_ready(max(0.0, self._start_timeout_s - (time.monotonic() - t0)))
        except WorkerFailed:
            self._replace(w)
            raise
        return w

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
