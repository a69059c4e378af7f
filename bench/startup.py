"""Start-up time: from the command to the first ``/health`` 200, cold and warm.

Runs the serve command (default ``.venv/bin/corral serve``) on a free port, twice: first with an
empty cache folder (``CORRAL_CACHE_DIR``: the embedded model is converted into it), then again
with the cache the first start filled. Prints the seconds to the first ``/health`` 200 and the
"ready in" the server printed itself. ``--command "make serve"`` on a fresh clone gives the
figure with the install included (``--runs 1``; the second start then reuses the new .venv).

    .venv/bin/python -m bench.startup
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench.provenance import free_port, header

READY = re.compile(r"ready in ([0-9.]+)s")


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def one_start(command: str, cache_dir: str, timeout_s: float) -> tuple[float, str]:
    """Seconds from spawning ``command`` to the first /health 200, and the server's own line."""
    port = free_port()
    env = os.environ | {"CORRAL_CACHE_DIR": cache_dir, "CORRAL_PORT": str(port)}
    argv = shlex.split(command)
    if argv[0] != "make":
        argv += ["--port", str(port)]
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while not healthy(port):
                if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    log.seek(0)
                    raise SystemExit(f"the server did not become healthy:\n{log.read()[-3000:]}")
                time.sleep(0.1)
            elapsed = time.monotonic() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        log.seek(0)
        found = READY.search(log.read())
    return elapsed, f"{found.group(1)} s" if found else "(no ready line)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--command", default=".venv/bin/corral serve")
    ap.add_argument("--runs", type=int, default=2, help="1: cold only; 2: cold, then warm")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    print(f"{header(__file__)}, command: {args.command}")
    with tempfile.TemporaryDirectory(prefix="corral-startup-") as cache:
        for i in range(args.runs):
            label = "empty model cache" if i == 0 else "model cache filled by the run before"
            elapsed, ready = one_start(args.command, cache, args.timeout)
            print(f"{label}: /health 200 after {elapsed:.1f} s (server's own 'ready in': {ready})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
