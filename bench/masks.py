#!/usr/bin/env python
"""Per-step grammar-mask fill: Corral's filler vs raw llguidance and raw xgrammar batch fills.

B rows walk real MaskBench instances (``json.dumps`` of a valid test instance, Llama-3
tokenizer) in lockstep. Every step each engine fills one mask per row at the same positions,
timed as one wall-clock step:

- ``corral``: the engine's own path, ``MaskFiller`` over Corral matchers (its compiler, then
  llguidance; rows with a native cursor in native batch chunks, each refined after the call,
  e.g. ``DistinctKeysMatcher``'s repeated-key check), waiting for every row (the same work as the peers);
- ``corral+deadline``: the same, in a second pass over the same walks (so over grammars whose
  lazily built tables are warmer), with the engine's per-step deadline (``--grace-ms`` after
  the fill starts, as if the forward took no time); the rows it defers are counted (they sit
  the step out in the engine);
- ``llguidance``: ``llguidance.torch.fill_next_token_bitmask_par`` over raw ``LLMatcher``s
  (llguidance's own JSON-schema converter), an ``LLExecutor`` of the same thread count;
- ``xgrammar``: ``BatchGrammarMatcher.batch_fill_next_token_bitmask`` over raw xgrammar
  matchers (JSON Schema semantics, not strict mode), ``max_threads`` the same;
- ``llg-batch(corral)``: llguidance's batch fill over the llguidance matchers inside Corral's
  own matchers (its grammars, its positions): what Corral's filler costs over the backend's own
  batch call, apart from the grammar Corral's compiler wrote.

Each engine compiles a schema once and starts every row on it from a fresh cursor (Corral's
matcher, a deep copy of the llguidance matcher, a new xgrammar matcher), as a server would.
Then every row accepts its next token in all three (untimed); a walk that ends, or that one
engine refuses, starts over with the next walk in every engine. Printed per (B, threads):
p50 / p99 / max step time of each, Corral's p50 over each peer's, and the deadline pass's
deferred rows.

    python -m bench.masks [--batches 16 64 256] [--threads 1 2 0] [--steps 60] [--schemas 40]

``--threads 0`` means all cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import llguidance
import llguidance.torch as llg_torch
import torch
import xgrammar

from bench.provenance import header
from corral.engine.constrained.masks import MaskFiller, MaskJob
from corral.engine.serving.config import EngineConfig, available_cores
from corral.engine.serving.core import SamplingParams, Sequence
from corral.fuzz.targets import FORMAT, Refused, compile_xgrammar_schema, make_target
from corral.fuzz.tokenizers import llama3_tokenizer
from corral.grammar.backends import llg as llg

BENCH_DIR = Path(__file__).resolve().parent

DEFAULT_CORPUS = BENCH_DIR.parents[1] / "shared" / "corpora" / "maskbench"


@dataclass
class Walk:
    """One valid instance of one schema, as tokens, with what each engine compiled."""

    name: str
    tokens: list[int]
    corral: object  # CompiledConstraint: each row's matcher is a cheap cursor over it
    llg: object  # llguidance.LLMatcher, never advanced: rows start from a deep copy of it
    xgr: object  # xgrammar.CompiledGrammar


class Row:
    """One batch row: the same walk in all three engines' matchers."""

    def __init__(self, walk: Walk) -> None:
        self.walk, self.pos = walk, 0
        self.seq = Sequence("bench", 0, [0], SamplingParams(), 0, matcher=walk.corral.matcher())
        self.llg = walk.llg.deep_copy()
        self.xgr = xgrammar.GrammarMatcher(walk.xgr)

    def advance(self) -> bool:
        """Every engine accepts the next token; False when the walk is over or refused."""
        if self.pos >= len(self.walk.tokens):
            return False
        t = self.walk.tokens[self.pos]
        self.pos += 1
        ok = self.seq.matcher.accept(t)
        ok = self.llg.consume_token(t) and ok
        ok = self.xgr.accept_token(t) and ok
        return ok and self.pos < len(self.walk.tokens)


def load_walks(corpus: Path, tok, limit: int) -> list[Walk]:
    """Valid instances of the first `limit` schemas (spread over the corpus) that all three
    engines compile."""
    corral = make_target("corral", tok)
    files = sorted(corpus.glob("*.json"))
    walks: list[Walk] = []
    used = 0
    for path in files[:: max(1, len(files) // (limit * 4))]:
        doc = json.loads(path.read_text())
        valid = [t["data"] for t in doc.get("tests", []) if t.get("valid")]
        if not valid:
            continue
        try:
            compiled = corral.compile(doc["schema"])
            grammar = llg.grammar_from_schema(doc["schema"], FORMAT)
            raw = llguidance.LLMatcher(tok.llguidance, grammar, log_level=0)
            xgr = compile_xgrammar_schema(doc["schema"], FORMAT, tok, strict=False)
        except (Refused, ValueError, RuntimeError, TypeError):
            continue
        for data in valid:
            ids = tok.encode(json.dumps(data, ensure_ascii=False))
            if len(ids) > 1:
                walks.append(Walk(path.name, ids, compiled, raw, xgr))
        used += 1
        if used == limit:
            break
    return walks


def llg_cursor(matcher) -> object:
    """The llguidance cursor inside a Corral matcher (``Matcher.native_cursor``; a wrapper's
    own filtering, such as ``DistinctKeysMatcher``'s, is left out of this column)."""
    return matcher.native_cursor()


def corral_fill(filler: MaskFiller, jobs: list[MaskJob], grace_ms: float | None) -> list[MaskJob]:
    """One step of the engine's own fill; the jobs that missed the deadline."""
    fill = filler.start(jobs, len(jobs))
    return filler.wait(fill, None if grace_ms is None else grace_ms / 1000)


def run(
    walks: list[Walk], tok, batch: int, threads: int, steps: int, grace_ms: float | None
) -> dict:
    """`steps` timed steps (after 3 warm-up ones) of B rows; `grace_ms` None: Corral waits for
    every row and the peers run too; else Corral alone, with that deadline."""
    words = tok.mask_words
    next_walk = iter(range(10**9))
    rows = [Row(walks[next(next_walk) % len(walks)]) for _ in range(batch)]
    filler = MaskFiller(tok.vocab_size, None, threads)
    executor = llguidance.LLExecutor(threads)
    xgr_batch = xgrammar.BatchGrammarMatcher(max_threads=threads)
    llg_mask = torch.empty(batch, words, dtype=torch.int32)
    xgr_mask = torch.empty(batch, words, dtype=torch.int32)
    times: dict[str, list[float]] = {"corral": [], "llguidance": [], "xgrammar": [], "own": []}
    deferred = 0
    for step in range(steps + 3):  # 3 warm-up steps
        jobs = [MaskJob(r.seq, [], i) for i, r in enumerate(rows)]
        own = [(llg_cursor(r.seq.matcher), i) for i, r in enumerate(rows)]
        took: dict[str, float] = {}
        # Corral's fill and the batch fill over its own matchers compute the same masks: the
        # one that runs second may find tables the first built, so they take turns going first.
        order = ["corral", "own"] if step % 2 else ["own", "corral"]
        if grace_ms is None:
            order += ["llguidance", "xgrammar"]
        else:
            order = ["corral"]
        calls = {
            "corral": partial(corral_fill, filler, jobs, grace_ms),
            "own": partial(llg_torch.fill_next_token_bitmask_par, executor, own, llg_mask),
            "llguidance": partial(
                llg_torch.fill_next_token_bitmask_par,
                executor,
                [(r.llg, i) for i, r in enumerate(rows)],
                llg_mask,
            ),
            "xgrammar": partial(
                xgr_batch.batch_fill_next_token_bitmask, [r.xgr for r in rows], xgr_mask
            ),
        }
        late: list[MaskJob] = []
        for name in order:
            t = time.perf_counter()
            got = calls[name]()
            took[name] = time.perf_counter() - t
            if name == "corral":
                late = got
        while any(j.seq.mask_busy for j in late):  # untimed: let late fills end
            time.sleep(0.0005)
        if step >= 3:
            for name, dt in took.items():
                times[name].append(dt)
            deferred += len(late)
        for i, r in enumerate(rows):
            r.seq.late_mask = None
            if not r.advance():
                rows[i] = Row(walks[next(next_walk) % len(walks)])
    filler.close()
    return {"times": times, "deferred": deferred}


def percentiles(xs: list[float]) -> tuple[float, float, float]:
    ms = sorted(x * 1e3 for x in xs)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return statistics.median(ms), p99, ms[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 0], help="0: all cores")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--schemas", type=int, default=40)
    ap.add_argument("--grace-ms", type=float, default=EngineConfig.mask_grace_ms)
    args = ap.parse_args()
    print(header(__file__))
    torch.set_num_threads(1)
    tok = llama3_tokenizer()
    walks = load_walks(args.corpus, tok, args.schemas)
    schemas = len({w.name for w in walks})
    print(
        f"{len(walks)} walks over {schemas} MaskBench schemas (Llama-3 tokenizer); "
        f"{args.steps} timed steps each; Corral's mask deadline {args.grace_ms} ms"
    )
    threads = sorted({t or available_cores() for t in args.threads})
    print(
        "per-step ms, p50 p99 max; c/llg, c/xgr: Corral's p50 over the peer's; deferred: rows "
        "the deadline pass deferred"
    )
    print(
        f"{'B':>4} {'thr':>3} | {'corral':>20} | {'llguidance':>20} | {'xgrammar':>20} | "
        f"{'c/llg':>5} {'c/xgr':>5} | {'llg-batch(corral)':>20} {'c/own':>5} | "
        f"{'corral+deadline':>20} | deferred"
    )
    for batch in args.batches:
        for t in threads:
            got = run(walks, tok, batch, t, args.steps, None)
            names = ("corral", "llguidance", "xgrammar", "own")
            c, lg, xg, own = (percentiles(got["times"][k]) for k in names)
            timed = run(walks, tok, batch, t, args.steps, args.grace_ms)
            cd = percentiles(timed["times"]["corral"])
            fmt = lambda p: f"{p[0]:6.2f} {p[1]:6.2f} {p[2]:6.2f}"  # noqa: E731
            print(
                f"{batch:>4} {t:>3} | {fmt(c):>20} | {fmt(lg):>20} | {fmt(xg):>20} | "
                f"{c[0] / lg[0]:5.2f} {c[0] / xg[0]:5.2f} | {fmt(own):>20} {c[0] / own[0]:5.2f} | "
                f"{fmt(cd):>20} | "
                f"{timed['deferred']} of {batch * args.steps}",
                flush=True,
            )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
