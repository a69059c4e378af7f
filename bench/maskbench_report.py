"""Summaries and the printed table for bench/maskbench.py."""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(results: list[dict]) -> dict:
    n = len(results)
    ok = [r for r in results if r["status"] == "ok"]
    passing = [r for r in ok if r["false_accept"] == 0 and r["false_reject"] == 0]
    ttfm = [r["ttfm_ms"] for r in ok]
    masks = [m for r in ok for m in r["masks_us"]]
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
        "ttfm_ms": {"p50": _pct(ttfm, 50), "p95": _pct(ttfm, 95), "max": max(ttfm, default=None)},
        "mask_us": {
            "avg": float(np.mean(masks)) if masks else None,
            "p50": _pct(masks, 50),
            "p99": _pct(masks, 99),
            "max": max(masks, default=None),
            "count": len(masks),
        },
        "per_subset": {
            k: {"passing": v[0], "schemas": v[1]} for k, v in sorted(per_subset.items())
        },
        "top_compile_errors": sorted(errors.items(), key=lambda kv: -kv[1])[:8],
    }


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def print_report(summary: dict[str, dict], n: int, seconds: float) -> None:
    engines = list(summary)
    print(f"\nMaskBench over {n} schemas ({seconds:.0f} s)\n")
    head = f"{'engine':<13}{'passing':>15}{'compile err':>12}{'timeout':>8}{'crash':>6}{'false acc':>10}{'false rej':>10}"
    head += f"{'ttfm p50':>10}{'ttfm p95':>10}{'mask avg':>9}{'p50':>7}{'p99':>8}{'max':>9}"
    print(head)
    for e in engines:
        s = summary[e]
        print(
            f"{e:<13}{s['passing']:>6} ({s['passing_pct']:5.1f}%){s['compile_errors']:>12}{s['timeouts']:>8}"
            f"{s['crashes']:>6}{s['false_accept_schemas']:>10}{s['false_reject_schemas']:>10}"
            f"{_f(s['ttfm_ms']['p50']):>10}{_f(s['ttfm_ms']['p95']):>10}{_f(s['mask_us']['avg'], '{:.1f}'):>9}"
            f"{_f(s['mask_us']['p50'], '{:.1f}'):>7}{_f(s['mask_us']['p99'], '{:.0f}'):>8}{_f(s['mask_us']['max'], '{:.0f}'):>9}"
        )
    print("\n(ttfm = time to first mask, ms; mask times in µs)\n")
    _print_ratios(summary)
    subsets = sorted({k for s in summary.values() for k in s["per_subset"]})
    print("\npassing per subset")
    print(f"{'subset':<24}" + "".join(f"{e:>14}" for e in engines))
    for k in subsets:
        row = ""
        for e in engines:
            c = summary[e]["per_subset"].get(k, {"passing": 0, "schemas": 0})
            row += f"{c['passing']:>8}/{c['schemas']:<5}"
        print(f"{k:<24}{row}")
    for e in engines:
        if summary[e]["top_compile_errors"]:
            print(f"\n{e}: most frequent compile errors")
            for msg, count in summary[e]["top_compile_errors"]:
                print(f"  {count:5d}  {msg}")


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b in (None, 0) else f"{a / b:.2f}x"


def _print_ratios(summary: dict[str, dict]) -> None:
    llg, xgr = summary.get("llguidance"), summary.get("xgrammar")
    for e in ("corral-cold", "corral-warm"):
        s = summary.get(e)
        if not s or not llg:
            continue
        print(
            f"{e}: passing {s['passing_pct'] - llg['passing_pct']:+.1f} pp vs llguidance; "
            f"ttfm p50 {_ratio(s['ttfm_ms']['p50'], llg['ttfm_ms']['p50'])}, "
            f"p95 {_ratio(s['ttfm_ms']['p95'], llg['ttfm_ms']['p95'])} of llguidance cold; "
            f"mask p50 {_ratio(s['mask_us']['p50'], xgr['mask_us']['p50']) if xgr else '-'} of xgrammar, "
            f"p99 {_ratio(s['mask_us']['p99'], llg['mask_us']['p99'])} of llguidance"
        )
