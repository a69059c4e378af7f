#!/usr/bin/env python
"""MaskBench: how many real schemas each engine enforces exactly, and how fast.

For every schema: compile it (time to first mask), then for each test instance tokenize
``json.dumps(data, ensure_ascii=False)`` with the Llama-3 tokenizer and, token by token, compute
the mask and check that the next token is allowed. A schema passes when it compiles, every valid
instance is accepted (and the matcher may end right after it) and every invalid one is rejected.

Engines, side by side in one run: Corral with a cold cache, Corral warm (new processes reading
the disk cache the cold run wrote), raw llguidance and raw xgrammar. Each engine runs in its own
worker process (one core each); a schema that runs past ``--timeout`` or crashes its worker is
counted, the worker replaced, and the run goes on.

    python bench/maskbench.py --sample 2000 --json bench/results/maskbench.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from maskbench_report import print_report, summarize  # noqa: E402

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench"
ALL_ENGINES = ["corral-cold", "corral-warm", "llguidance", "xgrammar"]


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


def _worker(conn, engine: str, cache_dir: str) -> None:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from maskbench_engines import ENGINES, run_schema

    from corral.grammar import TokenizerInfo

    tok = TokenizerInfo.llama3()
    eng = ENGINES[engine.split("-")[0]](tok, cache_dir)
    conn.send("ready")
    while True:
        path = conn.recv()
        if path is None:
            return
        try:
            conn.send(run_schema(eng, tok, path))
        except Exception as e:  # an engine bug on one schema is a result, not the end of the run
            conn.send({"file": os.path.basename(path), "status": "crash", "error": repr(e)[:300]})


class Worker:
    """A worker process for one engine; replaced after a timeout or a crash."""

    def __init__(self, engine: str, cache_dir: str) -> None:
        self.engine, self.cache_dir = engine, cache_dir
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker, args=(child, self.engine, self.cache_dir), daemon=True
        )
        self.proc.start()
        if self.conn.recv() != "ready":
            raise RuntimeError(f"{self.engine} worker failed to start")

    def run(self, path: Path, timeout: float) -> dict:
        self.conn.send(str(path))
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
            status = "timeout"
        except EOFError:
            status = "crash"
        self.proc.kill()
        self.proc.join()
        self._start()
        return {"file": path.name, "status": status}

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()


def run_lane(engines: list[str], files: list[Path], args, results: dict, progress: Counter) -> None:
    for engine in engines:
        worker = Worker(engine, args.cache_dir)
        out = results[engine] = []
        for path in files:
            r = worker.run(path, args.timeout)
            r["subset"] = subset_of(path.name)
            out.append(r)
            progress[engine] += 1
        worker.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--sample", type=int, default=None, help="stratified sample of N schemas")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", default=",".join(ALL_ENGINES))
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per schema")
    p.add_argument("--jobs", type=int, default=2, help="engines run side by side (one core each)")
    p.add_argument("--cache-dir", default=None, help="Corral's cache (default: a new empty folder)")
    p.add_argument("--json", type=Path, default=None, help="write the report as JSON")
    args = p.parse_args(argv)

    files = stratified_sample(sorted(args.corpus.glob("*.json")), args.sample, args.seed)
    if not files:
        p.error(f"no MaskBench files in {args.corpus}")
    args.cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="corral-maskbench-")
    engines = [e for e in args.engines.split(",") if e]
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

    summary = {e: summarize(results[e]) for e in engines}
    print_report(summary, len(files), time.time() - t0)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "schemas": len(files),
                    "summary": summary,
                    "results": {e: [_slim(r) for r in results[e]] for e in engines},
                },
                indent=1,
            )
        )
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
    return {k: v for k, v in r.items() if k != "masks_us"}


if __name__ == "__main__":
    sys.exit(main())
