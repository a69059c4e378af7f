#!/usr/bin/env python
"""How fast can an exact mask be here? The ceilings of the routes open to Corral, measured.

MaskBench asks Corral for a mask p50 within 1.5x of raw xgrammar's. Every Corral mask comes from
llguidance, the only backend that is exact; xgrammar precomputes masks per grammar position and
is faster, but not exact. This bench measures, on one stratified MaskBench sample, what each way
of closing that gap could give at best:

- Corral's own masks by where the position is in the JSON text: inside a value string after some
  content (llguidance reuses the mask of an unchanged lexer state there), the first position of a
  value string, inside a key, and between tokens (structure, numbers, literals);
- the pooled p50 if xgrammar's masks were served (a) for the schemas whose keywords xgrammar is
  taken to enforce exactly (``XGRAMMAR_EXACT``), (b) for every schema whose MaskBench instances
  xgrammar judged correctly (an optimistic bound: that is no proof of exactness, and xgrammar has
  false accepts on other schemas), each with and without a per-mask filter cost (``--filter-us``,
  an assumed figure, not measured here), and choosing per schema whichever engine is faster (an
  oracle: no policy knows that in advance);
- how long xgrammar's stored form takes to load (what a warm process would wait for).

    python -m bench.mask_ceiling --sample 200

Corral runs in this process (cold cache); xgrammar (the ``xgrammar-strict`` target, as in
MaskBench) runs in a worker process with a time limit. Both engines' configurations are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np
import torch

from bench.maskbench import DEFAULT_CORPUS, engine_worker, run_in, stratified_sample
from bench.maskbench_engines import corral_cached
from bench.provenance import header
from corral.fuzz.targets import CorralTarget, Refused, format_config, make_target
from corral.fuzz.tokenizers import llama3_tokenizer
from corral.grammar import TokenizerInfo
from corral.grammar.backends import xgr as xgr
from corral.grammar.core.walk import accepts
from corral.grammar.schema.facts import ANNOTATIONS

XGRAMMAR = "xgrammar-strict"  # the xgrammar target measured, configured as in MaskBench
#: Keywords taken to be enforced exactly by xgrammar (with a filter for its string bugs, see
#: docs/fuzzing.md). Deliberately narrow: `pattern`, `format`, lengths and bounds are left out.
XGRAMMAR_EXACT = ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
}
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMAS = ("additionalProperties", "items")
IN_STRING, STRING_START, KEY, BETWEEN = (
    "string, after content",
    "string, first position",
    "key",
    "between tokens",
)
CONTEXTS = (IN_STRING, STRING_START, KEY, BETWEEN)


class Row(NamedTuple):
    """One schema both engines walked: Corral's mask times (with each position's context) and
    xgrammar's, when it judged every instance correctly over the same positions."""

    path: Path
    corral_us: list[float]
    where: list[str]
    xgrammar_us: list[float] | None
    whitelisted: bool
    xgrammar_ttfm_ms: float | None


def xgrammar_exact(schema: object) -> bool:
    """Whether every keyword in ``schema`` is in XGRAMMAR_EXACT (and every ``$ref`` is local)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key not in XGRAMMAR_EXACT:
            return False
        if key in _SUBSCHEMA_MAPS:
            subs = value.values() if isinstance(value, dict) else [None]
        elif key in _SUBSCHEMAS:
            subs = [value]
        elif key == "anyOf":
            subs = value if isinstance(value, list) else [None]
        else:
            subs = []
            if key == "$ref" and not str(value).startswith("#"):
                return False
        if not all(xgrammar_exact(s) for s in subs):
            return False
    return True


def contexts(token_texts: list[str]) -> list[str]:
    """For each token, where in the JSON text the mask before it is computed."""
    out, in_string, escaped, is_key, fresh, stack, last = [], False, False, False, False, [], ""
    for text in token_texts:
        if in_string:
            out.append(KEY if is_key else STRING_START if fresh else IN_STRING)
        else:
            out.append(BETWEEN)
        for ch in text:
            if in_string:
                fresh = False
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
                continue
            if ch == '"':
                in_string, fresh = True, True
                is_key = bool(stack) and stack[-1] == "{" and last in "{,"
            elif ch in "{[":
                stack.append(ch)
            elif ch in "}]" and stack:
                stack.pop()
            if not ch.isspace():
                last = ch
    return out


def walk_corral(engine: CorralTarget, tok: TokenizerInfo, doc: dict, bitmask) -> tuple:
    """Corral's mask times over every test instance, with each position's context."""
    handle = engine.compile(doc["schema"])
    times: list[float] = []
    walks = []  # (token ids, masks measured): contexts are worked out after the timed walks
    for t in doc.get("tests", []):
        ids = tok.encode(json.dumps(t["data"], ensure_ascii=False))
        before = len(times)
        accepts(engine.matcher(handle), ids, bitmask, times)
        walks.append((ids, len(times) - before))
    where: list[str] = []
    for ids, n in walks:
        where += contexts([tok.hf_tokenizer.decode([i]) for i in ids[:n]])
    return times, where


def pooled_p50(rows: list[Row], served=lambda r: False, extra_us: float = 0.0) -> float:
    """Pooled mask p50 with xgrammar's times (plus ``extra_us``) where ``served(row)``."""
    parts = [
        np.asarray(r.xgrammar_us) + extra_us
        if r.xgrammar_us is not None and served(r)
        else np.asarray(r.corral_us)
        for r in rows
    ]
    return float(np.percentile(np.concatenate(parts), 50))


def measure(files: list[Path], tok: TokenizerInfo, timeout: float) -> list[Row]:
    """Corral first, all schemas in a row (as in MaskBench's worker: its data stays in the CPU's
    caches), then xgrammar over the same files in its worker process."""
    corral = corral_cached(tok, tempfile.mkdtemp(prefix="corral-ceiling-"))
    print(f"corral: {format_config(corral.config)}")
    print(f"{XGRAMMAR}: {format_config(make_target(XGRAMMAR, tok).config)}", flush=True)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    walked = []
    t0 = time.time()
    for n, path in enumerate(files, 1):
        doc = json.loads(path.read_text(encoding="utf-8"))
        try:
            times, where = walk_corral(corral, tok, doc, bitmask)
        except Refused:
            continue
        if times:  # a file without test instances has nothing to compare
            walked.append((path, times, where, xgrammar_exact(doc["schema"])))
        if n % 200 == 0:
            print(f"  [{time.time() - t0:5.0f}s] corral {n}/{len(files)}", flush=True)
    rows = []
    xgrammar = engine_worker(XGRAMMAR, "")
    for n, (path, times, where, whitelisted) in enumerate(walked, 1):
        x = run_in(xgrammar, path, timeout)
        clean = x.get("status") == "ok" and not x["false_accept"] and not x["false_reject"]
        same_positions = clean and len(x["masks_us"]) == len(times)
        x_times = x["masks_us"] if same_positions else None
        rows.append(Row(path, times, where, x_times, whitelisted, x.get("ttfm_ms")))
        if n % 200 == 0:
            print(f"  [{time.time() - t0:5.0f}s] xgrammar {n}/{len(walked)}", flush=True)
    xgrammar.close(grace_s=5)
    return rows


def report(rows: list[Row], tok: TokenizerInfo, filter_us: float, seconds: float) -> None:
    c_all = np.concatenate([r.corral_us for r in rows])
    w_all = np.concatenate([r.where for r in rows])
    x_rows = [r for r in rows if r.xgrammar_us is not None]
    x_p50 = float(np.percentile(np.concatenate([r.xgrammar_us for r in x_rows]), 50))
    print(f"\n{len(rows)} schemas Corral compiles, {len(c_all)} mask positions, {seconds:.0f} s")
    print(
        f"Corral mask p50 {np.percentile(c_all, 50):.1f} us; xgrammar p50 {x_p50:.1f} us over "
        f"the {len(x_rows)} schemas it judged correctly; bar 1.5x = {1.5 * x_p50:.1f} us\n"
    )
    print(f"{'Corral, by position':28} {'share':>6} {'p25':>6} {'p50':>6} {'p75':>6}")
    for c in CONTEXTS:
        sel = c_all[w_all == c]
        q = np.percentile(sel, [25, 50, 75]) if len(sel) else [float("nan")] * 3
        print(f"{c:28} {len(sel) / len(c_all):6.1%} {q[0]:6.1f} {q[1]:6.1f} {q[2]:6.1f}")

    assumed = f"+{filter_us:g} us assumed"
    print(
        f"\n{'pooled mask p50 if xgrammar served':44} {'positions':>9} {'+0 us':>6} "
        f"{assumed:>16} {'best-of':>8}"
    )
    for label, eligible in (
        ("schemas in XGRAMMAR_EXACT", lambda r: r.whitelisted),
        ("every schema it judged correctly (unsound)", lambda r: True),
    ):
        share = sum(len(r.corral_us) for r in x_rows if eligible(r)) / len(c_all)
        plain = pooled_p50(rows, eligible)
        filtered = pooled_p50(rows, eligible, filter_us)
        best = pooled_p50(  # per schema, whichever engine has the lower median (an oracle)
            rows,
            lambda r, eligible=eligible: (
                eligible(r) and np.median(r.xgrammar_us) + filter_us < np.median(r.corral_us)
            ),
            filter_us,
        )
        print(f"{label:44} {share:9.1%} {plain:6.1f} {filtered:16.1f} {best:8.1f}")
    print(
        f"(+{filter_us:g} us: an assumed cost of a filter for xgrammar's string bugs, added to "
        "each of its masks; not measured)"
    )
    _print_load_times(rows, tok)


def _print_load_times(rows: list[Row], tok: TokenizerInfo) -> None:
    """How long xgrammar's stored form of XGRAMMAR_EXACT schemas takes to load, in this
    process: what a warm process would wait for."""
    xgrammar = make_target(XGRAMMAR, tok)
    loads = []
    # in this process: only schemas whose xgrammar compile took under a second in the worker
    for r in rows:
        if len(loads) >= 60:
            break
        if not r.whitelisted or r.xgrammar_ttfm_ms is None or r.xgrammar_ttfm_ms > 1000:
            continue
        doc = json.loads(r.path.read_text(encoding="utf-8"))
        try:
            blob = xgr.serialize(xgrammar.compile(doc["schema"]))
        except Refused:  # nothing to load
            continue
        s = time.perf_counter()
        xgr.deserialize(blob, tok)
        loads.append(((time.perf_counter() - s) * 1e3, len(blob)))
    if loads:
        ms, size = np.array(loads).T
        print(
            f"\nxgrammar stored form, {len(loads)} XGRAMMAR_EXACT schemas: load p50 "
            f"{np.percentile(ms, 50):.2f} ms, p90 {np.percentile(ms, 90):.2f} ms; "
            f"size p50 {np.percentile(size, 50) / 1e3:.0f} kB"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--sample", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per xgrammar schema")
    p.add_argument(
        "--filter-us",
        type=float,
        default=1.5,
        help="assumed cost of a soundness filter per mask (not measured) (default: %(default)s)",
    )
    args = p.parse_args(argv)
    print(header(__file__), flush=True)
    torch.set_num_threads(1)

    files = stratified_sample(sorted(args.corpus.glob("*.json")), args.sample, args.seed)
    tok = llama3_tokenizer()
    t0 = time.time()
    rows = measure(files, tok, args.timeout)
    report(rows, tok, args.filter_us, time.time() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
