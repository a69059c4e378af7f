"""A day in an hour: `corral serve` driven with every endpoint and constraint kind, watched for leaks.

Starts `corral serve` on the default model (or drives `--url`, with `--pid` the server's process
id on this machine) with a small admission limit, and sends `--concurrency` clients' requests for
`--minutes`: chat completions (json_schema with non-ASCII keys, enums and patterns; json_object;
regex; choice; EBNF; Lark; structural tags; tools required, named and auto with non-ASCII
arguments), completions, Responses (json_schema, tools), and the constraint endpoints (validate,
precompile, a refusal that must be a 400); streamed and not, a quarter of the streams hung up
mid-way, and more clients than the server admits, so some get a 429. Every answer is judged
(`jsonschema`, `re`, the tools' parameters): `corral.fuzz.load_kinds` has the mix and the judges,
`corral.fuzz.load_soak` the loop.

    python -m bench.soak                       # one hour against its own server
    python -m bench.soak --minutes 10 --warmup-minutes 3 --window-minutes 3

Every `--report-minutes` it prints the server's RSS, open file descriptors and threads
(/proc/<pid>), the KV pool's use, the radix cache's tokens, the compile cache's bytes (memory and
disk, from /metrics) and the counts so far (ok, 429, disconnected, 5xx, invalid outputs,
unexpected statuses, transport errors, stuck requests). At the end: the growth from the first
window after warm-up to the last window (RSS medians; descriptor and thread minimums, since
open connections come and go), and whether anything is still held by a request. It exits 1 on any
5xx (or error event), invalid output, unexpected status, stuck request, growth past the bounds,
or anything held after the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench.peer_servers import start, stop
from bench.provenance import free_port, header
from corral.fuzz.load_soak import SERVER_FLAGS, Bounds, SoakConfig, soak, summary


def _server(cache: Path, extra: list[str]):
    from corral.engine.loading.assets import resolve_model_folder

    # the converted default model is shared; the compile cache starts empty in `cache`
    (cache / "models").symlink_to(resolve_model_folder(None).parent, target_is_directory=True)
    port = free_port()
    cmd = [sys.executable, "-m", "corral.cli", "serve", "--port", str(port),
           "--cache-dir", str(cache), *SERVER_FLAGS, *extra]  # fmt: skip
    print("server:", " ".join(cmd[2:]), flush=True)
    server = start(
        "Corral", cmd, f"http://127.0.0.1:{port}", os.sched_getaffinity(0), timeout_s=600
    )
    if server is None:
        raise SystemExit("corral serve did not start")
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="drive this server instead of starting one (needs --pid)")
    ap.add_argument("--pid", type=int, help="the --url server's process id, read from /proc")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--warmup-minutes", type=float, default=10.0)
    ap.add_argument("--window-minutes", type=float, default=10.0)
    ap.add_argument("--report-minutes", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=12, help="clients; more than the 8 admitted")
    ap.add_argument("--rss-bound-mib", type=float, default=Bounds.rss_mib)
    ap.add_argument("--fds-bound", type=int, default=Bounds.fds)
    ap.add_argument("--threads-bound", type=int, default=Bounds.threads)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-arg", action="append", default=[], help="passed to corral serve")
    args = ap.parse_args(argv)
    if args.url and not args.pid:
        ap.error("--url needs --pid: the soak reads the server's /proc entry")
    print(header(__file__), flush=True)
    with tempfile.TemporaryDirectory(prefix="corral-soak-") as tmp:
        server = None if args.url else _server(Path(tmp), args.server_arg)
        try:
            url = args.url or server.url
            cfg = SoakConfig(
                url=url, api_key=args.api_key, model=server.model if server else _model(url, args),
                pid=args.pid or server.proc.pid, seconds=args.minutes * 60,
                concurrency=args.concurrency, warmup_s=args.warmup_minutes * 60,
                window_s=args.window_minutes * 60, report_s=args.report_minutes * 60,
                seed=args.seed,
                bounds=Bounds(args.rss_bound_mib, args.fds_bound, args.threads_bound),
            )  # fmt: skip
            print(f"{cfg.concurrency} clients for {args.minutes:g} min; growth: the "
                  f"{args.window_minutes:g} min after a {args.warmup_minutes:g}-min warm-up "
                  f"against the last {args.window_minutes:g} min", flush=True)  # fmt: skip
            result = soak(cfg, lambda s: print(s, flush=True))
        finally:
            if server is not None:
                stop(server)
    for line in summary(result):
        print(line)
    return 0 if result.passed() else 1


def _model(url: str, args: argparse.Namespace) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"}
    return httpx.get(url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]


if __name__ == "__main__":
    sys.exit(main())
