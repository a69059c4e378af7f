"""The soak: load with disconnects against a running `corral serve`, for minutes.

A wave sends `n` concurrent `json_schema` requests (streamed or not); a share of the streaming
clients hang up at a random point (before the first byte, or after a random number of events).
Every request that runs to its end is judged: `finish_reason` "stop" content must validate
against its schema (jsonschema, Draft 2020-12), an error event or a 5xx is a failure, and a
request with no answer within `timeout_s` is stuck. After a wave the server must come back to
its baseline: nothing admitted, nothing running, no KV slot held by a request.

    python -m bench.load --url http://127.0.0.1:8000 --api-key KEY --pid PID --minutes 5  # the soak

The soak runs rounds (64 streamed requests of which a third hang up, then 64 plain ones) for
`--minutes` after one warm-up round, and prints per round what happened, what is still held and
the server's RSS (with `--pid`); it exits 1 on any failure or stuck request.

`tests/api/test_api_load.py` runs one short round of the same waves against its own server.
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx

from bench.provenance import header
from corral.fuzz.load import Tally, round_of_waves, rss_bytes, wait_for_baseline


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--pid", type=int, help="the server's process id, to track its RSS")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    print(header(__file__), flush=True)
    model = httpx.get(args.url + "/v1/models", headers={"Authorization": f"Bearer {args.api_key}"},
                      timeout=30).json()["data"][0]["id"]  # fmt: skip
    # One round first, not counted: what a server allocates once at this concurrency (buffers,
    # compiled schemas, allocator arenas) is not a leak; RSS is compared from after it.
    warm = round_of_waves(args.url, args.api_key, model, args.concurrency, -2, args.max_tokens)
    print(f"warm-up: {warm.line()}; held after {wait_for_baseline(args.url)}", flush=True)
    rss0 = rss_bytes(args.pid) if args.pid else None
    total, rnd = Tally(), 0
    end = time.monotonic() + args.minutes * 60
    while time.monotonic() < end:
        t = round_of_waves(
            args.url, args.api_key, model, args.concurrency, rnd * 2, args.max_tokens
        )
        held = wait_for_baseline(args.url)
        total.add(t)
        rss = f"; RSS {rss_bytes(args.pid) / 2**20:.0f} MiB" if args.pid else ""
        print(f"round {rnd}: {t.line()}; held after {held}{rss}", flush=True)
        rnd += 1
    print(f"all: {total.line()}")
    for f in total.failures[:20]:
        print("  ", f)
    if rss0:
        rss1 = rss_bytes(args.pid)
        print(f"RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB ({(rss1 / rss0 - 1) * 100:+.1f}%)")
    return 1 if total.failures or total.stuck else 0


if __name__ == "__main__":
    sys.exit(main())
