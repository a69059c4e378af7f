"""A real ``redis-server`` on 127.0.0.1 for the tests (imported by name; not a test module).

``RedisServer(folder)`` starts one on a free port, configured as docs/deployment.md recommends for the
shared cache (``maxmemory`` with ``allkeys-lru``, no persistence); ``stop()`` stops it, and
``start()`` starts it again on the same port (Redis back after an outage, empty). When
``redis-server`` is not installed (``make test`` installs it with apt-get where it can), the
test is skipped with that reason.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

START_TIMEOUT_S = 20


def redis_server_binary() -> str:
    """The ``redis-server`` executable, or a skip that says why there is none."""
    found = shutil.which("redis-server")
    if found is None:
        pytest.skip(
            "redis-server is not installed and could not be installed here "
            "(`make test` runs apt-get install -y redis-server where it can)"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process; ``url`` names it, ``client()`` talks to it directly."""

    def __init__(self, folder: Path, maxmemory: str = "64mb") -> None:
        self.binary = redis_server_binary()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.maxmemory = maxmemory
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        """Start it (again, on the same port) and wait until it answers PING."""
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", str(self.folder),
               "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru",
               "--logfile", str(self.folder / "redis.log")]  # fmt: skip
        import redis

        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        give_up = time.monotonic() + START_TIMEOUT_S
        with self.client() as client:
            while self.proc.poll() is None and time.monotonic() < give_up:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    time.sleep(0.02)  # not listening yet
        self.stop()
        log = self.folder / "redis.log"
        why = log.read_text()[-2000:] if log.exists() else "(no log)"
        pytest.fail(f"redis-server did not start on port {self.port}:\n{why}")

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s); nothing is saved."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def client(self):
        """A redis-py client of this server (bytes in, bytes out)."""
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5)
