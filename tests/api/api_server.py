"""A real `corral serve` subprocess on 127.0.0.1 for the API tests (imported by conftest)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key-123"
STARTUP_TIMEOUT_S = 300


@dataclass
class Server:
    url: str
    api_key: str
    model: str
    proc: subprocess.Popen
    log: Path

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key, max_retries=0, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model_folder: Path,
    cache: Path,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    api_key: str = API_KEY,
) -> Server:
    """Start `corral serve` with the default model in cache folder `cache` and wait until healthy.

    The converted model is linked in from the shared model cache so it is not converted again;
    the compiled-constraint cache starts empty. `env` adds environment variables (fault knobs).
    Stop it with `stop_server`.
    """
    (cache / "models").symlink_to(model_folder.parent, target_is_directory=True)
    port = _free_port()
    log = cache / "server.log"
    cmd = [sys.executable, "-m", "corral.cli", "serve", "--port", str(port), "--api-key", api_key,
           "--cache-dir", str(cache), *extra_args]  # fmt: skip
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    full_env.update(env or {})
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    model = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            r = httpx.get(url + "/health", timeout=2)
            if r.status_code == 200:
                model = r.json()["model"]
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    if model is None:
        proc.kill()
        pytest.fail(f"corral serve did not become healthy:\n{log.read_text()[-4000:]}")
    return Server(url, api_key, model, proc, log)


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
