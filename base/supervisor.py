"""Killable worker processes: the one supervisor for every child that may crash or hang.

Native code (a grammar compile, an engine's mask) cannot be interrupted from Python, so the only
hard deadline is a separate process that can be killed. A :class:`Worker` is such a child: a
plain ``python -P -m <module>`` subprocess (not a fork or a multiprocessing spawn, so the
parent's ``__main__`` is never re-imported and nothing else is inherited) that talks over its
stdin/stdout in frames: a 4-byte little-endian length, then the bytes. What the bytes hold is
the caller's choice; the compile cache never sends a pickle (JSON headers and
``CompiledConstraint.to_bytes()``), the fuzzer pickles messages between its own processes.

The parent's side, :class:`Worker`: start (the init frames are written on a thread, as they may
exceed a pipe buffer while the child is still starting), a start-up handshake with a timeout,
:meth:`Worker.recv` with a deadline (``select`` on the pipe), kill and reap (no zombie), a lazy
restart on the next :meth:`Worker.send`, and a clean close. The child's side:
:func:`child_channel`.

The child never imports from the parent's working directory: ``-P`` keeps the current directory
off its ``sys.path``, and ``PYTHONPATH`` entries are made absolute, empty ones (which mean the
current directory) dropped, so a stray ``lark.py`` or ``json.py`` cannot shadow a package.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO

_LEN = struct.Struct("<I")
_READ_CHUNK = 1 << 20
_EXIT_WAIT_S = 5.0  # how long a child whose output ended may take to exit before it is killed


class DeadlineExceeded(Exception):
    """No complete frame came from the worker by the deadline; the worker still runs."""


class WorkerFailed(RuntimeError):
    """The worker died, could not start, or started wrong."""


def worker_command(module: str) -> list[str]:
    """A worker's command line: ``-P`` keeps the current directory off its ``sys.path``."""
    return [sys.executable, "-P", "-m", module]


def worker_env(pythonpath: Sequence[str] = ()) -> dict[str, str]:
    """The environment for a worker: ours, with ``pythonpath`` put first on ``PYTHONPATH``, its
    entries made absolute and the empty ones (which would mean the current directory) dropped."""
    env = dict(os.environ)
    entries = [*pythonpath, *env.get("PYTHONPATH", "").split(os.pathsep)]
    if "PYTHONPATH" in env or pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in entries if p)
    env["PYTHONSAFEPATH"] = "1"
    return env


def _read_frame(stream: BinaryIO) -> bytes | None:
    """One frame from a blocking stream, or None at the end of the stream."""
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack(head)
    body = stream.read(n)
    return body if len(body) == n else None


def _write_frame(stream: BinaryIO, data: bytes) -> None:
    stream.write(_LEN.pack(len(data)) + data)


class Channel:
    """The child's end of the pipes: frames in from stdin, frames out to stdout."""

    def __init__(self, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self._in, self._out = stdin, stdout

    def recv(self) -> bytes | None:
        """The next frame; None when the parent closed the pipe (time to exit)."""
        return _read_frame(self._in)

    def send(self, *frames: bytes) -> None:
        for data in frames:
            _write_frame(self._out, data)
        self._out.flush()


def child_channel() -> Channel:
    """The channel to the parent; call it first in a worker's ``main``.

    Ctrl-C is left to the parent (which stops its workers), and ``sys.stdout`` becomes stderr
    so that a stray print cannot corrupt the frame stream.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    sys.stdout = sys.stderr
    return channel


class Worker:
    """One supervised child process; started on demand, and again on demand after a kill.

    ``init`` frames are written to each new child first; its first reply must be ``hello``
    (within ``start_timeout_s``), which says it is ready. ``label`` names it in errors ("a
    compile worker died ..."). ``pythonpath``: folders the child imports from (made absolute).

    Not thread-safe: one thread uses a worker at a time. Only :meth:`killer`'s functions (and
    :meth:`close`, which makes a running :meth:`recv` fail) may be called from other threads.
    """

    def __init__(
        self,
        module: str,
        *,
        label: str,
        init: Sequence[bytes] = (),
        hello: bytes = b"ready",
        start_timeout_s: float = 120.0,
        pythonpath: Sequence[str] = (),
    ) -> None:
        self._command = worker_command(module)
        self._env = worker_env(pythonpath)
        self._label = label
        self._init = list(init)
        self._hello = hello
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen | None = None
        self._buf = bytearray()
        self._ready = False

    @property
    def pid(self) -> int | None:
        """The running child's process id; None when none is running."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def start(self) -> None:
        """Start a child unless one runs; returns without waiting for it to be ready."""
        if self._proc is not None:
            return
        proc = subprocess.Popen(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env
        )
        self._proc, self._buf, self._ready = proc, bytearray(), False
        threading.Thread(target=self._send_init, args=(proc,), daemon=True).start()

    def _send_init(self, proc: subprocess.Popen) -> None:
        try:
            for data in self._init:
                _write_frame(proc.stdin, data)
            proc.stdin.flush()
        except (OSError, ValueError):
            pass  # the child died or was closed: wait_ready reports it

    def wait_ready(self) -> None:
        """Start a child if none runs and wait for its hello; WorkerFailed (and the child is
        killed) if it dies, stays silent past the start timeout, or says something else."""
        self.start()
        if self._ready:
            return
        try:
            hello = self.recv(time.monotonic() + self._start_timeout_s)
        except DeadlineExceeded:
            self.kill()
            raise WorkerFailed(
                f"a {self._label} did not start within {self._start_timeout_s:.0f} s"
            ) from None
        except WorkerFailed as e:
            self.kill()
            raise WorkerFailed(f"{e} while starting") from None
        if hello != self._hello:
            self.kill()
            raise WorkerFailed(f"a {self._label} started wrong: it said {hello[:200]!r}")
        self._ready = True

    def send(self, data: bytes) -> None:
        """Send one frame, first starting a child (and waiting until it is ready) if none runs.

        The write blocks while the pipe is full, so send only what the child reads promptly.
        """
        self.wait_ready()
        proc = self._running()
        try:
            _write_frame(proc.stdin, data)
            proc.stdin.flush()
        except (OSError, ValueError) as e:  # ValueError: closed from another thread
            raise self._died(proc) from e

    def recv(self, deadline: float) -> bytes:
        """The child's next frame; DeadlineExceeded if it is not complete by ``deadline`` (a
        ``time.monotonic()`` value; the part read so far is kept for the next call), or
        WorkerFailed if the child died (it is reaped; the next send starts a new one)."""
        proc = self._running()
        while (frame := self._take_frame()) is None:
            self._fill(proc, deadline)
        return frame

    def _take_frame(self) -> bytes | None:
        if len(self._buf) < _LEN.size:
            return None
        (n,) = _LEN.unpack_from(self._buf)
        end = _LEN.size + n
        if len(self._buf) < end:
            return None
        frame = bytes(self._buf[_LEN.size : end])
        del self._buf[:end]
        return frame

    def _fill(self, proc: subprocess.Popen, deadline: float) -> None:
        left = deadline - time.monotonic()
        try:
            fd = proc.stdout.fileno()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise DeadlineExceeded
            chunk = os.read(fd, _READ_CHUNK)
        except (OSError, ValueError) as e:  # the pipe was closed from another thread
            raise WorkerFailed(f"a {self._label} was stopped") from e
        if not chunk:
            raise self._died(proc)
        self._buf += chunk

    def _died(self, proc: subprocess.Popen) -> WorkerFailed:
        """Reap a child whose pipe broke (the next send starts a new one) and say so."""
        code = _exit_code(proc)
        if self._proc is proc:
            self.kill()
        return WorkerFailed(f"a {self._label} died (exit code {code})")

    def _running(self) -> subprocess.Popen:
        proc = self._proc
        if proc is None:
            raise WorkerFailed(f"a {self._label} is not running")
        return proc

    def killer(self) -> Callable[[], None]:
        """A function that kills the child running now, from any thread, and never a later one
        (the thread that uses the worker sees it die and reaps it)."""
        proc = self._proc
        return proc.kill if proc is not None else _nothing

    def kill(self) -> None:
        """Kill and reap the child, if one runs, and close its pipes; the next :meth:`send`
        starts a new one."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            _close_pipes(proc)

    def close(self, grace_s: float = 2.0) -> None:
        """Close the child's stdin, which ends its loop, and kill it if it lingers."""
        proc = self._proc
        if proc is None:
            return
        _close_pipes(proc, stdout=False)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def _exit_code(proc: subprocess.Popen) -> int:
    """The exit code of a child whose output ended; one that lingers is killed."""
    try:
        return proc.wait(_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _close_pipes(proc: subprocess.Popen, stdout: bool = True) -> None:
    for pipe in (proc.stdin, proc.stdout) if stdout else (proc.stdin,):
        try:
            pipe.close()
        except OSError:
            pass


def _nothing() -> None:
    pass
