"""uvicorn's plain stack (asyncio + h11) against ``uvicorn[standard]``'s (uvloop + httptools).

The same server (the embedded model, ``corral serve``'s configuration) is started twice in this
run, once per stack, and given the same load from one client process:

- ``GET /v1/models``, ``--light`` requests at a concurrency of 32: the HTTP layer alone;
- streaming ``/v1/chat/completions`` with ``max_tokens`` 8, ``--chats`` requests at a
  concurrency of 16: what a client of the model sees (time to first byte, time to the end).

Needs ``uvloop`` and ``httptools`` installed (``pip install uvloop httptools``).

    .venv/bin/python -m bench.http_stack
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.provenance import free_port, header

STACKS = {"asyncio+h11": ("asyncio", "h11"), "uvloop+httptools": ("uvloop", "httptools")}
CHAT = {
    "messages": [{"role": "user", "content": "Name a colour."}],
    "max_tokens": 8,
    "temperature": 0,
    "stream": True,
}


def serve(loop: str, http: str, port: int) -> None:
    """The child: ``corral serve``'s state and app under the given uvicorn stack."""
    import uvicorn

    from corral.api.app import create_app
    from corral.api.config import ServerConfig
    from corral.api.server import build_state

    state = build_state(ServerConfig(port=port))
    uvicorn.run(create_app(state), port=port, loop=loop, http=http, log_level="warning")


def start(stack: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    loop, http = STACKS[stack]
    cmd = [sys.executable, "-m", "bench.http_stack", "--child", loop, http, str(port)]
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1])
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 600:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the {stack} server exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the {stack} server did not become healthy")


async def light(url: str, n: int, concurrency: int) -> float:
    """Requests per second of ``GET /v1/models``."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one() -> None:
            async with sem:
                r = await client.get("/v1/models")
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - t0)


async def chats(url: str, n: int, concurrency: int) -> tuple[float, float, float]:
    """Median time to first byte and to the end of a streamed chat, and the wall time for all."""
    sem = asyncio.Semaphore(concurrency)
    firsts: list[float] = []
    ends: list[float] = []
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one() -> None:
            async with sem:
                t0 = time.perf_counter()
                async with client.stream("POST", "/v1/chat/completions", json=CHAT) as r:
                    r.raise_for_status()
                    first = None
                    async for _ in r.aiter_bytes():
                        first = first or time.perf_counter()
                firsts.append((first or time.perf_counter()) - t0)
                ends.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t0
    return statistics.median(firsts), statistics.median(ends), wall


def measure(stack: str, args: argparse.Namespace) -> dict[str, float]:
    proc, url = start(stack)
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        CHAT["model"] = model
        httpx.post(url + "/v1/chat/completions", json=CHAT | {"stream": False}, timeout=300)
        rps = asyncio.run(light(url, args.light, 32))
        ttfb, end, wall = asyncio.run(chats(url, args.chats, 16))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"models_rps": rps, "chat_ttfb_s": ttfb, "chat_end_s": end, "chat_wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--light", type=int, default=3000, help="GET /v1/models requests")
    ap.add_argument("--chats", type=int, default=64, help="streamed chat completions")
    ap.add_argument("--rounds", type=int, default=4, help="rounds; the first stack alternates")
    ap.add_argument("--child", nargs=3, metavar=("LOOP", "HTTP", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        serve(args.child[0], args.child[1], int(args.child[2]))
        return 0
    print(header(__file__))
    results: dict[str, list[dict[str, float]]] = {s: [] for s in STACKS}
    for i in range(args.rounds):  # ABBA: each stack goes first in half of the rounds
        order = list(STACKS) if i % 2 == 0 else list(reversed(STACKS))
        for stack in order:
            r = measure(stack, args)
            results[stack].append(r)
            print(f"round {i + 1} {stack}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
    med = {s: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for s, runs in results.items()}  # fmt: skip
    plain, std = med["asyncio+h11"], med["uvloop+httptools"]
    print(f"{'figure (median of ' + str(args.rounds) + ' rounds)':<40} {'asyncio+h11':>12} "
          f"{'uvloop+httptools':>17} {'ratio':>7}")  # fmt: skip
    for key, label in (
        ("models_rps", f"GET /v1/models, req/s ({args.light}, 32 open)"),
        ("chat_ttfb_s", "streamed chat, time to first byte (s)"),
        ("chat_end_s", "streamed chat, time to last byte (s)"),
        ("chat_wall_s", f"{args.chats} streamed chats, wall (s)"),
    ):
        print(f"{label:<40} {plain[key]:>12.3f} {std[key]:>17.3f} {std[key] / plain[key]:>6.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
