"""The fuzz run: schemas in, cases out to workers and endpoints, findings saved, one report.

The budget is a number of schemas or a wall-clock time (worker start-up excluded); when it is
spent no new schema is started and the ones in flight finish.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.fuzz import case as K
from corral.fuzz.case import Case, CaseResult, Failure
from corral.fuzz.casework import CaseConfig
from corral.fuzz.corpus import interleave, iter_corpus, iter_generated
from corral.fuzz.http_target import HttpConfig, HttpTarget
from corral.fuzz.pool import ABORTED, InlinePool, WorkerPool, make_pool
from corral.fuzz.report import Report
from corral.fuzz.targets import target_config
from corral.fuzz.worker import TokenizerSpec, WorkerSpec


@dataclass(frozen=True)
class FuzzConfig:
    targets: tuple[str, ...]
    corpus: tuple[str, ...] = ()
    generate: bool = False  # also draw schemas with the Hypothesis strategy (always, if no corpus)
    max_schemas: int | None = 100
    max_seconds: float | None = None
    seed: int = 0
    jobs: int = 1
    stage_timeout_s: float = 60.0
    case: CaseConfig = field(default_factory=CaseConfig)
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    http: HttpConfig = field(default_factory=HttpConfig)
    out_dir: str | None = "fuzz-findings"
    progress: bool = True
    #: Hard Unicode in every schema's strings and keys, and in the prompt (`unicodify`), and
    #: schemas drawn from `unicode.unicode_schemas` beside them.
    unicode: bool = False


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def cases(cfg: FuzzConfig) -> Iterator[Case]:
    sources: list[Iterator[Case]] = []
    if cfg.corpus:
        sources.append(iter_corpus(list(cfg.corpus), cfg.seed))
    if cfg.generate or not cfg.corpus:
        sources.append(iter_generated(cfg.seed))
    if cfg.unicode:
        from corral.fuzz.unicodify import iter_unicode_schemas, unicode_case

        sources = [map(unicode_case, s) for s in sources]
        sources.append(iter_unicode_schemas(cfg.seed))
    return interleave(*sources)


def run_fuzz(cfg: FuzzConfig) -> Report:
    """Fuzz every target with the configured schemas; returns the report (see :class:`Report`)."""
    local = tuple(t for t in cfg.targets if not is_url(t))
    remote = [HttpTarget(t, cfg.http) for t in cfg.targets if is_url(t)]
    spec = WorkerSpec(local, cfg.tokenizer, cfg.case)
    pool = make_pool(cfg.jobs, spec, cfg.stage_timeout_s) if local else None
    try:
        for h in remote:
            h.start()
            if h.choice and h.dialect:
                d = h.dialect
                print(f"corral fuzz: {h.name}: dialect {d.name} ({d.describe}), chosen {h.choice}",
                      file=sys.stderr)  # fmt: skip
        return _loop(cfg, pool, remote)
    finally:
        if pool:
            pool.close()
        for h in remote:
            h.close()


def _loop(
    cfg: FuzzConfig, pool: WorkerPool | InlinePool | None, remote: list[HttpTarget]
) -> Report:
    from tqdm import tqdm

    urls = {h.name: h for h in remote}
    report = Report(
        list(cfg.targets),
        {
            "seed": cfg.seed,
            "targets": list(cfg.targets),
            "engines": {t: urls[t].config if t in urls else target_config(t) for t in cfg.targets},
            "corpus": list(cfg.corpus),
            "unicode": cfg.unicode,
            "out_dir": cfg.out_dir,
        },
    )
    source, started, t0 = cases(cfg), 0, time.monotonic()
    cap = max(1, cfg.jobs) + sum(h.cfg.concurrency for h in remote)
    total = cfg.max_schemas if cfg.max_schemas is not None else int(cfg.max_seconds or 0)
    bar = tqdm(
        total=total,
        unit="schema" if cfg.max_schemas else "s",
        file=sys.stderr,
        disable=not cfg.progress,
        dynamic_ncols=True,
    )
    pending: set[Future] = set()
    # Past the time budget the cases in flight get a grace period, then they are abandoned.
    hard_stop = t0 + cfg.max_seconds * 1.1 + 5 if cfg.max_seconds is not None else None
    abandoned = 0
    with ThreadPoolExecutor(max(1, cfg.jobs)) as ex:
        while True:
            while len(pending) < cap and _budget_left(cfg, started, t0):
                case = next(source, None)
                if case is None:
                    break
                started += 1
                if pool:
                    pending.add(ex.submit(pool.run_case, case))
                pending.update(h.submit(case) for h in remote)
            if not pending:
                break
            if hard_stop is not None and time.monotonic() > hard_stop:
                hard_stop = None
                if pool:
                    pool.abort()
                for fut in pending:
                    fut.cancel()  # cancels requests to URL targets; running workers see abort()
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            abandoned += _collect(done, report, cfg)
            _progress(bar, report, cfg, t0, total)
    report.meta["abandoned"] = abandoned
    bar.close()
    report.meta["elapsed_s"] = time.monotonic() - t0
    return report


def _collect(done: set[Future], report: Report, cfg: FuzzConfig) -> int:
    """Add finished cases to the report and save their reproducers; returns how many were
    abandoned instead."""
    abandoned = 0
    for fut in done:
        if fut.cancelled():
            abandoned += 1
            continue
        result: CaseResult = fut.result()
        if result.note == ABORTED:
            abandoned += 1
            continue
        _save(result, cfg)
        report.add(result)
    return abandoned


def _progress(bar: Any, report: Report, cfg: FuzzConfig, t0: float, total: int) -> None:
    bar.set_postfix_str(_postfix(report), refresh=False)
    if cfg.max_schemas is not None:
        bar.n = len(report.cases)
    else:
        bar.n = min(total, int(time.monotonic() - t0))
    bar.refresh()


def _budget_left(cfg: FuzzConfig, started: int, t0: float) -> bool:
    if cfg.max_schemas is not None and started >= cfg.max_schemas:
        return False
    return cfg.max_seconds is None or time.monotonic() - t0 < cfg.max_seconds


def _postfix(report: Report) -> str:
    counts = {k: report.count((k,)) for k in (K.UNSOUND, K.INCOMPLETE, K.CRASH, K.HANG)}
    return f"schemas={len(report.cases)} " + " ".join(f"{k}={v}" for k, v in counts.items())


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:120]


def _save(result: CaseResult, cfg: FuzzConfig) -> None:
    if not cfg.out_dir:
        return
    for out in result.outcomes.values():
        for f in out.failures:
            folder = Path(cfg.out_dir) / _safe(f.target)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{f.kind}--{_safe(f.case_id)}.json"
            path.write_text(json.dumps(reproducer(f, cfg), indent=2, ensure_ascii=False))
            f.reproducer = str(path)


def reproducer(f: Failure, cfg: FuzzConfig) -> dict[str, Any]:
    """A MaskBench-format case (so a folder of them replays with ``--corpus``) plus metadata."""
    tests = []
    if f.text is not None:
        try:
            data = json.loads(f.text)
            tests.append(
                {"description": f.detail[:200], "valid": f.kind == K.INCOMPLETE, "data": data}
            )
        except ValueError:
            pass  # not JSON: the raw text in "fuzz" is the evidence
    return {
        "description": f"corral fuzz: {f.kind} on {f.target} ({f.case_id})",
        "schema": f.schema,
        "tests": tests,
        "fuzz": {
            "target": f.target,
            "kind": f.kind,
            "detail": f.detail,
            "case": f.case_id,
            "keywords": list(f.keywords),
            "shrunk": f.shrunk,
            "text": f.text,
            "original_schema": f.original_schema,
            "original_text": f.original_text,
            "seed": cfg.seed,
            "replay": f"corral fuzz --target {f.target} --corpus <this file> --budget 1",
        },
    }
