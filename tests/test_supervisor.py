"""corral.base.supervisor with real child processes: one that answers, one that hangs past the
deadline (killed, and a new one started on the next send), one that dies, one that never says
it is ready, and a stray ``json.py``/``lark.py`` in the working directory that must not be
imported by the child."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from corral.base.supervisor import DeadlineExceeded, Worker, WorkerFailed

CHILD = """
import json
import os
import time

from corral.base.supervisor import child_channel

channel = child_channel()
init = channel.recv()
if init != b"mute":
    channel.send(b"ready")
while (request := channel.recv()) is not None:
    if request == b"hang":
        time.sleep(3600)
    elif request == b"die":
        os._exit(3)
    elif request == b"modules":
        import lark

        channel.send(json.dumps([json.__file__, lark.__file__]).encode())
    else:
        channel.send(request)
"""

BIG = b"x" * (3 << 20)  # larger than a pipe buffer, both ways


@pytest.fixture
def make_worker(tmp_path):
    """``make_worker(init=...)``: a Worker running the child above; closed after the test."""
    (tmp_path / "supervisor_child.py").write_text(CHILD)
    made: list[Worker] = []

    def make(init: bytes = b"", start_timeout_s: float = 60.0) -> Worker:
        w = Worker(
            "supervisor_child",
            label="test worker",
            init=[init],
            start_timeout_s=start_timeout_s,
            pythonpath=[str(tmp_path)],
        )
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def reaped(pid: int) -> bool:
    """Whether process ``pid`` is gone, zombie included (Linux: no /proc entry)."""
    return not Path(f"/proc/{pid}").exists()


def soon(seconds: float) -> float:
    return time.monotonic() + seconds


def test_a_child_answers_frames_of_any_size(make_worker):
    w = make_worker(init=BIG)
    w.send(b"ping")
    assert w.recv(soon(30)) == b"ping"
    w.send(BIG)
    assert w.recv(soon(30)) == BIG


def test_a_child_past_its_deadline_is_killed_and_restarted_on_the_next_send(make_worker):
    w = make_worker()
    w.send(b"hang")
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        w.recv(soon(0.5))
    assert time.monotonic() - t0 < 3
    hung = w.pid
    w.kill()
    assert w.pid is None and reaped(hung)
    w.send(b"again")
    assert w.recv(soon(30)) == b"again"
    assert w.pid not in (None, hung)


def test_a_child_that_dies_is_reported_and_replaced(make_worker):
    w = make_worker()
    w.send(b"die")
    with pytest.raises(WorkerFailed, match=r"a test worker died \(exit code 3\)"):
        w.recv(soon(30))
    w.send(b"still there?")
    assert w.recv(soon(30)) == b"still there?"


def test_a_killer_from_another_thread_stops_only_the_child_running_then(make_worker):
    w = make_worker()
    w.wait_ready()
    kill_first = w.killer()
    w.kill()
    w.start()
    kill_first()  # the first child is gone already: the new one is left alone
    w.send(b"ping")
    assert w.recv(soon(30)) == b"ping"
    w.killer()()
    with pytest.raises(WorkerFailed):
        w.recv(soon(30))


def test_a_child_that_never_says_ready_fails_to_start_within_the_timeout(make_worker):
    w = make_worker(init=b"mute", start_timeout_s=1.0)
    with pytest.raises(WorkerFailed, match="did not start within 1 s"):
        w.send(b"ping")
    assert w.pid is None  # killed, not left running


def test_close_ends_the_child(make_worker):
    w = make_worker()
    w.wait_ready()
    pid = w.pid
    w.close()
    assert w.pid is None and reaped(pid)


def test_the_child_does_not_import_from_the_working_directory(make_worker, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("json", "lark"):
        (cwd / f"{name}.py").write_text(f"raise ImportError('the {name}.py of the cwd')\n")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", os.pathsep + "relative-dir")  # an empty entry: the cwd
    w = make_worker()
    w.send(b"modules")
    files = json.loads(w.recv(soon(60)))
    assert len(files) == 2 and not any(f.startswith(str(cwd) + os.sep) for f in files), files
