"""Summaries and the printed report for bench/maskbench.py.

Each engine's own figures cover the schemas it compiled and the positions it walked, so an
engine that refuses the hard schemas, or stops early in an instance, looks faster than one that
does the work. The common figures compare the engines over the same work: the schemas every
engine compiled, and in each test instance the token positions every engine reached (a walk
stops at the first token refused). Ratios are printed for both.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from corral.fuzz.targets import format_config


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def ttfm_stats(ttfm_ms: list[float]) -> dict:
    return {"p50": _pct(ttfm_ms, 50), "p95": _pct(ttfm_ms, 95), "max": max(ttfm_ms, default=None)}


def mask_stats(masks_us: list[float]) -> dict:
    return {
        "avg": float(np.mean(masks_us)) if masks_us else None,
        "p50": _pct(masks_us, 50),
        "p99": _pct(masks_us, 99),
        "max": max(masks_us, default=None),
        "count": len(masks_us),
    }


def summarize(results: list[dict]) -> dict:
    """One engine's figures over its own results."""
    n = len(results)
    ok = [r for r in results if r["status"] == "ok"]
    passing = [r for r in ok if r["false_accept"] == 0 and r["false_reject"] == 0]
    per_subset: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        per_subset[r["subset"]][1] += 1
    for r in passing:
        per_subset[r["subset"]][0] += 1
    errors: dict[str, int] = defaultdict(int)
    for r in results:
        if r["status"] == "compile_error":
            errors[r.get("error", "")[:90]] += 1
    return {
        "schemas": n,
        "passing": len(passing),
        "passing_pct": 100.0 * len(passing) / n if n else 0.0,
        "compile_errors": sum(r["status"] == "compile_error" for r in results),
        "timeouts": sum(r["status"] == "timeout" for r in results),
        "crashes": sum(r["status"] == "crash" for r in results),
        "false_accept_schemas": sum(r["false_accept"] > 0 for r in ok),
        "false_reject_schemas": sum(r["false_reject"] > 0 for r in ok),
        "ttfm_ms": ttfm_stats([r["ttfm_ms"] for r in ok]),
        "mask_us": mask_stats([m for r in ok for m in r["masks_us"]]),
        "per_subset": {
            k: {"passing": v[0], "schemas": v[1]} for k, v in sorted(per_subset.items())
        },
        "top_compile_errors": sorted(errors.items(), key=lambda kv: -kv[1])[:8],
    }


def common_figures(results: dict[str, list[dict]]) -> dict:
    """Every engine's ttfm over the schemas all engines compiled, and its mask times over the
    token positions all engines reached in those schemas' instances."""
    by_file = {e: {r["file"]: r for r in rs} for e, rs in results.items()}
    first = next(iter(by_file.values()), {})
    files = [f for f in first if all(rs[f]["status"] == "ok" for rs in by_file.values())]
    ttfm: dict[str, list[float]] = {e: [] for e in results}
    masks: dict[str, list[float]] = {e: [] for e in results}
    for f in files:
        rows = {e: rs[f] for e, rs in by_file.items()}
        for e, kept in _common_positions(rows).items():
            ttfm[e].append(rows[e]["ttfm_ms"])
            masks[e] += kept
    engines = {e: {"ttfm_ms": ttfm_stats(ttfm[e]), "mask_us": mask_stats(masks[e])} for e in ttfm}
    positions = len(next(iter(masks.values()), []))
    return {"schemas": len(files), "positions": positions, "engines": engines}


def _common_positions(rows: dict[str, dict]) -> dict[str, list[float]]:
    """Each engine's mask times at the positions every engine reached, instance by instance."""
    per_engine = (r["instance_masks"] for r in rows.values())
    reached = [min(counts) for counts in zip(*per_engine, strict=True)]
    kept: dict[str, list[float]] = {}
    for e, r in rows.items():
        times, start, kept[e] = r["masks_us"], 0, []
        for n, k in zip(r["instance_masks"], reached, strict=True):
            kept[e] += times[start : start + k]
            start += n
    return kept


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


_TIMING_HEAD = f"{'ttfm p50':>10}{'ttfm p95':>10}{'mask avg':>9}{'p50':>7}{'p99':>8}{'max':>9}"


def _timing_cells(figures: dict) -> str:
    t, m = figures["ttfm_ms"], figures["mask_us"]
    return (
        f"{_f(t['p50']):>10}{_f(t['p95']):>10}{_f(m['avg'], '{:.1f}'):>9}"
        f"{_f(m['p50'], '{:.1f}'):>7}{_f(m['p99'], '{:.0f}'):>8}{_f(m['max'], '{:.0f}'):>9}"
    )


def print_report(
    configs: dict[str, dict], summary: dict[str, dict], common: dict, n: int, seconds: float
) -> None:
    engines = list(summary)
    print(f"\nMaskBench over {n} schemas ({seconds:.0f} s)\n\nengines")
    for e in engines:
        print(f"  {e}: {format_config(configs[e])}")
    print("\neach engine over the schemas it compiled and the positions it reached")
    print(
        f"{'engine':<16}{'passing':>15}{'compile err':>12}{'timeout':>8}{'crash':>6}"
        f"{'false acc':>10}{'false rej':>10}{_TIMING_HEAD}"
    )
    for e in engines:
        s = summary[e]
        print(
            f"{e:<16}{s['passing']:>6} ({s['passing_pct']:5.1f}%){s['compile_errors']:>12}"
            f"{s['timeouts']:>8}{s['crashes']:>6}{s['false_accept_schemas']:>10}"
            f"{s['false_reject_schemas']:>10}{_timing_cells(s)}"
        )
    print(
        f"\nover the same work: the {common['schemas']} schemas every engine compiled, the "
        f"{common['positions']} token positions every engine reached"
    )
    print(f"{'engine':<16}{_TIMING_HEAD}")
    for e in engines:
        print(f"{e:<16}{_timing_cells(common['engines'][e])}")
    print("\n(ttfm = time to first mask, ms; mask times in µs)\n")
    _print_ratios(summary, common)
    _print_subsets(summary)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b in (None, 0) else f"{a / b:.2f}x"


def _ratios(ours: dict, peer: dict) -> str:
    t, pt, m, pm = ours["ttfm_ms"], peer["ttfm_ms"], ours["mask_us"], peer["mask_us"]
    return (
        f"ttfm p50 {_ratio(t['p50'], pt['p50'])}, p95 {_ratio(t['p95'], pt['p95'])}; "
        f"mask avg {_ratio(m['avg'], pm['avg'])}, p50 {_ratio(m['p50'], pm['p50'])}, "
        f"p99 {_ratio(m['p99'], pm['p99'])}, max {_ratio(m['max'], pm['max'])}"
    )


def _print_ratios(summary: dict[str, dict], common: dict) -> None:
    """Corral's figures over each peer's: over the same work, then over each one's own."""
    ours = [e for e in summary if e.startswith("corral")]
    peers = [e for e in summary if e not in ours]
    for e in ours:
        for p in peers:
            s, ps = summary[e], summary[p]
            same = _ratios(common["engines"][e], common["engines"][p])
            print(f"{e} / {p}, same work: {same}")
            print(
                f"{e} / {p}, own work:  passing {s['passing_pct'] - ps['passing_pct']:+.1f} pp; "
                f"{_ratios(s, ps)}"
            )


def _print_subsets(summary: dict[str, dict]) -> None:
    engines = list(summary)
    subsets = sorted({k for s in summary.values() for k in s["per_subset"]})
    print("\npassing per subset")
    print(f"{'subset':<24}" + "".join(f"{e:>16}" for e in engines))
    for k in subsets:
        row = ""
        for e in engines:
            c = summary[e]["per_subset"].get(k, {"passing": 0, "schemas": 0})
            row += f"{c['passing']:>10}/{c['schemas']:<5}"
        print(f"{k:<24}{row}")
    for e in engines:
        if summary[e]["top_compile_errors"]:
            print(f"\n{e}: most frequent compile errors")
            for msg, count in summary[e]["top_compile_errors"]:
                print(f"  {count:5d}  {msg}")
