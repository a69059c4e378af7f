#!/usr/bin/env python
"""MaskBench: how many real schemas each engine enforces exactly, and how fast.

For every schema: compile it (time to first mask), then for each test instance tokenize
``json.dumps(data, ensure_ascii=False)`` with the Llama-3 tokenizer and, token by token, compute
the mask and check that the next token is allowed. A schema passes when it compiles, every valid
instance is accepted (and the matcher may end right after it) and every invalid one is rejected.

Engines, side by side in one run: Corral with a cold cache, Corral warm (new processes reading
the disk cache the cold run wrote), raw llguidance and raw xgrammar in its strict mode (the fuzz
targets of the same names, configured once in ``corral.fuzz.targets``; the report prints every
engine's configuration). Each engine runs in its own worker process (one core each, supervised
by ``corral.base.supervisor``); a schema that runs past ``--timeout`` or crashes its worker is
counted, the worker replaced, and the run goes on.

Besides each engine's own figures, the report compares the engines over the same work: the
schemas every engine compiled, and the token positions every engine reached.

    python -m bench.maskbench --sample 2000 --json bench/results/maskbench.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # every engine's worker gets one core
BENCH_DIR = Path(__file__).resolve().parent
from bench.maskbench_engines import CORRAL_CACHED, engine_config  # noqa: E402
from bench.maskbench_report import common_figures, print_report, summarize  # noqa: E402
from bench.provenance import header  # noqa: E402
from corral.base.supervisor import DeadlineExceeded, Worker, WorkerFailed  # noqa: E402
from corral.fuzz.targets import check_target_name  # noqa: E402

DEFAULT_CORPUS = BENCH_DIR.parents[1] / "shared" / "corpora" / "maskbench"
ALL_ENGINES = ["corral-cold", "corral-warm", "llguidance", "xgrammar-strict"]
STARTUP_TIMEOUT_S = 600.0  # a worker builds Llama-3's tokenizer tables (and Corral's workers)


def subset_of(name: str) -> str:
    return name.split("---")[0] if "---" in name else re.sub(r"_\d+\.json$", "", name)


def stratified_sample(files: list[Path], n: int | None, seed: int) -> list[Path]:
    if not n or n >= len(files):
        return files
    by_subset: dict[str, list[Path]] = defaultdict(list)
    for f in files:
        by_subset[subset_of(f.name)].append(f)
    rng = random.Random(seed)
    picked: list[Path] = []
    for _, group in sorted(by_subset.items()):
        k = max(1, round(n * len(group) / len(files)))
        picked += rng.sample(group, min(k, len(group)))
    return sorted(picked)


def engine_worker(engine: str, cache_dir: str) -> Worker:
    """The worker process of one engine (``maskbench_engines.main``); it starts on first use."""
    init = json.dumps({"engine": engine, "cache_dir": cache_dir}).encode()
    return Worker(
        "bench.maskbench_engines",
        label=f"MaskBench {engine} worker",
        init=[init],
        start_timeout_s=STARTUP_TIMEOUT_S,
        pythonpath=[str(BENCH_DIR.parent)],
    )


def run_in(worker: Worker, path: Path, timeout: float) -> dict:
    """One schema's result; one past ``timeout`` seconds or one that crashes the worker is
    counted as such, and the worker replaced (a new one starts with the next schema)."""
    worker.send(str(path).encode())
    try:
        return json.loads(worker.recv(time.monotonic() + timeout))
    except DeadlineExceeded:
        status = "timeout"
    except WorkerFailed:
        status = "crash"
    worker.kill()
    return {"file": path.name, "status": status}


def run_lane(engines: list[str], files: list[Path], args, results: dict, progress: Counter) -> None:
    for engine in engines:
        worker = engine_worker(engine, args.cache_dir)
        out = results[engine] = []
        for path in files:
            r = run_in(worker, path, args.timeout)
            r["subset"] = subset_of(path.name)
            out.append(r)
            progress[engine] += 1
        worker.close(grace_s=5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--sample", type=int, default=None, help="stratified sample of N schemas")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--engines",
        default=",".join(ALL_ENGINES),
        help="corral-cold, corral-warm, or fuzz target names (corral, llguidance, xgrammar, "
        "xgrammar-strict) (default: %(default)s)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per schema")
    p.add_argument("--jobs", type=int, default=2, help="engines run side by side (one core each)")
    p.add_argument("--cache-dir", default=None, help="Corral's cache (default: a new empty folder)")
    p.add_argument("--json", type=Path, default=None, help="write the report as JSON")
    args = p.parse_args(argv)
    print(header(__file__), flush=True)

    files = stratified_sample(sorted(args.corpus.glob("*.json")), args.sample, args.seed)
    if not files:
        p.error(f"no MaskBench files in {args.corpus}")
    args.cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="corral-maskbench-")
    engines = [e for e in args.engines.split(",") if e]
    if unknown := [e for e in engines if e not in CORRAL_CACHED and check_target_name(e)]:
        p.error(f"unknown engine(s) {unknown}; see --help")
    lanes = _lanes(engines, args.jobs)
    print(
        f"MaskBench: {len(files)} schemas from {args.corpus}, engines {engines}, "
        f"{len(lanes)} lanes, cache {args.cache_dir}",
        flush=True,
    )

    results: dict[str, list[dict]] = {}
    progress: Counter = Counter()
    threads = [
        threading.Thread(target=run_lane, args=(lane, files, args, results, progress))
        for lane in lanes
    ]
    t0 = time.time()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(10)
        done = ", ".join(f"{e} {progress[e]}/{len(files)}" for e in engines)
        print(f"  [{time.time() - t0:6.0f}s] {done}", flush=True)
    for t in threads:
        t.join()

    configs = {e: engine_config(e) for e in engines}
    summary = {e: summarize(results[e]) for e in engines}
    common = common_figures({e: results[e] for e in engines})
    print_report(configs, summary, common, len(files), time.time() - t0)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "schemas": len(files),
            "engines": configs,
            "summary": summary,
            "common": common,
            "results": {e: [_slim(r) for r in results[e]] for e in engines},
        }
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def _lanes(engines: list[str], jobs: int) -> list[list[str]]:
    """Corral warm must follow Corral cold (it reads what cold wrote); the rest spread out."""
    lanes: list[list[str]] = [[] for _ in range(max(1, jobs))]
    corral = [e for e in engines if e.startswith("corral")]
    others = [e for e in engines if not e.startswith("corral")]
    if corral:
        lanes[0] += corral
    for i, e in enumerate(others):
        lanes[(i + (1 if corral and jobs > 1 else 0)) % len(lanes)].append(e)
    return [lane for lane in lanes if lane]


def _slim(r: dict) -> dict:
    """A result without its per-mask times, keeping the slowest mask (to find the schema)."""
    out = {k: v for k, v in r.items() if k not in ("masks_us", "instance_masks")}
    if r.get("masks_us"):
        out["mask_max_us"] = round(max(r["masks_us"]), 1)
    return out


if __name__ == "__main__":
    sys.exit(main())
