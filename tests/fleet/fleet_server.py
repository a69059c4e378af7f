"""A real `corral fleet` subprocess (local Ray, N replicas) on 127.0.0.1 for the fleet tests.

Ray starts lean: the CPUs given, no dashboard, its temp folder under /tmp. The fleet runs in its
own session, so stopping it (SIGTERM, then SIGKILL of the whole group) also ends any Ray process
that outlived the driver.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

STARTUP_TIMEOUT_S = 420
API_KEY = "fleet-key"
REPLICA_HEADER = "x-corral-replica"


@dataclass
class Fleet:
    url: str
    api_key: str
    model: str
    cache: Path
    proc: subprocess.Popen
    log: Path

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key, max_retries=0, **kw)

    def get(self, path: str, replica: str | None = None) -> httpx.Response:
        """GET through the fleet, pinned to ``replica`` when given."""
        headers = {REPLICA_HEADER: replica} if replica else {}
        return httpx.get(self.url + path, headers=headers, timeout=30)

    def metric(self, replica: str, name: str, labels: str = "") -> float:
        """One sample of ``replica``'s /metrics (``labels`` must all be present)."""
        r = self.get("/metrics", replica)
        assert r.headers[REPLICA_HEADER] == replica, "the pin was not honoured"
        for line in r.text.splitlines():
            m = re.match(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", line)
            if m and all(p in (m.group(1) or "") for p in filter(None, labels.split(","))):
                return float(m.group(2))
        raise AssertionError(f"{name}{{{labels}}} not in replica {replica}'s /metrics")

    def replica_ids(self, want: int, tries: int = 200) -> list[str]:
        """The replicas' ids, read from the header of idle /health answers (the router breaks
        ties between idle replicas at random)."""
        seen: set[str] = set()
        for _ in range(tries):
            r = self.get("/health")
            assert r.status_code == 200, r.text
            seen.add(r.headers[REPLICA_HEADER])
            if len(seen) == want:
                return sorted(seen)
        raise AssertionError(f"only {len(seen)} of {want} replicas ever answered")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fleet(model_folder: Path, cache: Path, replicas: int, args: tuple[str, ...]) -> Fleet:
    """Start `corral fleet` with the default model and wait until every replica is ready."""
    (cache / "models").symlink_to(model_folder.parent, target_is_directory=True)
    port = _free_port()
    log = cache / "fleet.log"
    cmd = [sys.executable, "-m", "corral.cli", "fleet", "--replicas", str(replicas),
           "--port", str(port), "--api-key", API_KEY, "--cache-dir", str(cache), *args]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "RAY_"))}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if f"at {url}/v1" in log.read_text(errors="replace"):  # printed once all are ready
            model = httpx.get(url + "/health", timeout=10).json()["model"]
            return Fleet(url, API_KEY, model, cache, proc, log)
        time.sleep(1)
    stop_fleet_process(proc)
    pytest.fail(f"corral fleet did not start:\n{log.read_text(errors='replace')[-6000:]}")


def stop_fleet_process(proc: subprocess.Popen) -> None:
    """SIGTERM (the fleet shuts Serve and Ray down), then SIGKILL to what is left of its group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session the fleet was started in
    except ProcessLookupError:
        pass
