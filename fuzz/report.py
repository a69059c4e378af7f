"""Aggregating case results: per-target and per-keyword summaries, as text, Markdown or JSON."""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from corral.fuzz import case as K
from corral.fuzz.case import CaseResult, Failure
from corral.fuzz.differential import DiffStats
from corral.fuzz.findings import finding_line, findings_markdown
from corral.fuzz.stats import LogHistogram, percentile
from corral.fuzz.targets import format_config
from corral.fuzz.verdict import reason_key

#: Columns of the per-keyword table, in order.
KEYWORD_KINDS = (K.UNSOUND, K.INCOMPLETE, "refused")
#: The row of failures whose shrunk schema has no keyword left: plain JSON is mishandled.
NO_KEYWORD = "(no keyword)"


@dataclass
class TargetStats:
    name: str
    schemas: int = 0
    status: dict[str, int] = field(default_factory=dict)  # ok / refused / error / crash / hang
    failing: dict[str, int] = field(default_factory=dict)  # kind -> schemas with such a failure
    walks: dict[str, int] = field(default_factory=dict)
    valid_checked: int = 0
    valid_rejected: int = 0
    invalid_checked: int = 0
    invalid_accepted: int = 0
    compile_s: list[float] = field(default_factory=list)
    mask: LogHistogram = field(default_factory=LogHistogram)
    slowest: list[tuple[float, str]] = field(default_factory=list)  # (compile s, case id)
    judged: int = 0  # schemas on which something the target did was judged
    refused: Counter[str] = field(default_factory=Counter)  # reason -> schemas refused
    unjudged: Counter[str] = field(default_factory=Counter)  # reason -> schemas not judged else

    def summary(self) -> dict[str, Any]:
        c = self.compile_s
        return {
            "schemas": self.schemas,
            "judged": self.judged,
            "refused_reasons": dict(self.refused),
            "unjudged_reasons": dict(self.unjudged),
            "status": self.status,
            "failing_schemas": self.failing,
            "walks": self.walks,
            "valid_instances": {"checked": self.valid_checked, "rejected": self.valid_rejected},
            "invalid_instances": {
                "checked": self.invalid_checked,
                "accepted": self.invalid_accepted,
            },
            "compile_ms": {
                "p50": percentile(c, 0.5) * 1e3,
                "p95": percentile(c, 0.95) * 1e3,
                "max": max(c, default=0) * 1e3,
            },
            "mask_us": {
                "mean": self.mask.mean * 1e6,
                "p50": self.mask.percentile(0.5) * 1e6,
                "p99": self.mask.percentile(0.99) * 1e6,
                "max": self.mask.max * 1e6,
                "count": self.mask.n,
            },
            "slowest_compiles": [
                {"case": cid, "ms": s * 1e3} for s, cid in sorted(self.slowest)[::-1]
            ],
        }


class Report:
    """Everything a run found. ``add`` each case result as it arrives (from any thread's
    future, called from one thread)."""

    def __init__(self, targets: list[str], meta: dict[str, Any] | None = None) -> None:
        self.targets = {t: TargetStats(t) for t in targets}
        self.meta = dict(meta or {})
        self.cases: set[str] = set()
        self.unjudged: dict[str, str] = {}
        self.keywords: dict[str, dict[str, dict[str, int]]] = {}
        self.failures: list[Failure] = []
        self.diff: dict[str, DiffStats] = {}  # engine pair -> summed differential counts

    def add(self, result: CaseResult) -> None:
        self.cases.add(result.case_id)
        if not result.judged:
            self.unjudged[result.case_id] = result.note
            return
        for pair, st in result.diff.items():
            self.diff.setdefault(pair, DiffStats()).add(st)
        for name, out in result.outcomes.items():
            st = self.targets[name]
            st.schemas += 1
            st.status[out.status] = st.status.get(out.status, 0) + 1
            if out.judged:
                st.judged += 1
            elif out.status == "refused":
                st.refused[reason_key(out.reason)] += 1
            else:
                st.unjudged[reason_key(out.reason or out.status)] += 1
            for kind in out.kinds():
                st.failing[kind] = st.failing.get(kind, 0) + 1
            for k, v in out.walks.items():
                st.walks[k] = st.walks.get(k, 0) + v
            st.valid_checked += out.valid_checked
            st.valid_rejected += out.valid_rejected
            st.invalid_checked += out.invalid_checked
            st.invalid_accepted += out.invalid_accepted
            if out.status == "ok":
                st.compile_s.append(out.compile_s)
                heapq.heappush(st.slowest, (out.compile_s, result.case_id))
                if len(st.slowest) > 5:
                    heapq.heappop(st.slowest)
            st.mask.merge(out.mask)
            for kw in result.keywords:
                cell = self._cell(kw, name)
                cell["schemas"] += 1
                if out.status == "refused":
                    cell["refused"] += 1
            for f in out.failures:
                for kw in f.keywords or (NO_KEYWORD,):
                    cell = self._cell(kw, name)
                    cell[f.kind] = cell.get(f.kind, 0) + 1
            self.failures.extend(out.failures)

    def _cell(self, kw: str, target: str) -> dict[str, int]:
        row = self.keywords.setdefault(kw, {})
        return row.setdefault(target, {"schemas": 0, "refused": 0})

    def engines(self) -> dict[str, dict[str, Any]]:
        """How each target was configured (engine versions, strictness, JSON layout)."""
        return self.meta.get("engines", {})

    def count(self, kinds: tuple[str, ...]) -> int:
        """How many findings of the given kinds (the CI gate)."""
        return sum(1 for f in self.failures if f.kind in kinds)

    # -- rendering ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "schemas": len(self.cases),
            "unjudgeable": len(self.unjudged),
            "targets": {n: s.summary() for n, s in self.targets.items()},
            "keywords": self.keywords,
            "differential": {p: dataclasses.asdict(st) for p, st in self.diff.items()},
            "failures": [dataclasses.asdict(f) for f in self.failures],
        }

    def target_rows(self) -> list[list[str]]:
        head = [
            "target",
            "schemas",
            "judged",
            "compiled",
            "refused",
            *K.ROW_KINDS,
            "crash",
            "hang",
            "compile ms p50/p95/max",
            "mask µs p50/p99/max",
        ]
        rows = [head]
        for name, st in self.targets.items():
            s = st.summary()
            c, m = s["compile_ms"], s["mask_us"]
            rows.append(
                [
                    name,
                    str(st.schemas),
                    str(st.judged),
                    str(st.status.get("ok", 0)),
                    str(st.status.get("refused", 0)),
                    *(str(st.failing.get(k, 0)) for k in K.ROW_KINDS),
                    str(st.status.get(K.CRASH, 0)),
                    str(st.status.get(K.HANG, 0)),
                    f"{c['p50']:.1f}/{c['p95']:.1f}/{c['max']:.0f}",
                    f"{m['p50']:.0f}/{m['p99']:.0f}/{m['max']:.0f}",
                ]
            )
        return rows

    def diff_rows(self) -> list[list[str]]:
        """Differential mode, one row per engine pair (see `differential.DiffStats`)."""
        names = list(DiffStats.__dataclass_fields__)
        rows = [["engine pair", *names]]
        for pair, st in self.diff.items():
            rows.append([pair.replace("|", " vs "), *(str(getattr(st, n)) for n in names)])
        return rows

    def keyword_rows(self, limit: int = 40) -> list[list[str]]:
        """Keywords, most failures first; a cell is unsound/incomplete/refused/schemas."""
        names = list(self.targets)

        def weight(kw: str) -> tuple[int, int, str]:
            cells = self.keywords[kw].values()
            bad = sum(c.get(K.UNSOUND, 0) * 10 + c.get(K.INCOMPLETE, 0) for c in cells)
            return (-bad, -sum(c.get("refused", 0) for c in cells), kw)

        rows = [["keyword", *names]]
        for kw in sorted(self.keywords, key=weight)[:limit]:
            row = [kw]
            for n in names:
                c = self.keywords[kw].get(n, {"schemas": 0})
                row.append("/".join(str(c.get(k, 0)) for k in (*KEYWORD_KINDS, "schemas")))
            rows.append(row)
        return rows

    def to_text(self) -> str:
        m = self.meta
        lines = [
            f"corral fuzz: {len(self.cases)} schemas ({len(self.unjudged)} unjudgeable, skipped), "
            f"seed {m.get('seed')}, {m.get('elapsed_s', 0):.0f} s"
            + (f", {m['abandoned']} abandoned when time ran out" if m.get("abandoned") else ""),
            "",
            *(f"{name}: {format_config(c)}" for name, c in self.engines().items()),
            "",
            _table(self.target_rows()),
            *(
                [
                    "",
                    "mask differences (positions compared, where the masks differed, tokens "
                    "allowed by one engine only, and how the sampled ones were judged)",
                    _table(self.diff_rows()),
                ]
                if self.diff
                else []
            ),
            "",
            "per keyword (cells: unsound/incomplete/refused/schemas; a failure counts for every "
            "keyword left in its shrunk schema)",
            _table(self.keyword_rows()),
            *(["", *self.judged_lines(reasons=False)] if self.judged_lines() else []),
        ]
        slowest = {n: max(st.slowest) for n, st in self.targets.items() if st.slowest}
        slow = [f"{n} {s * 1e3:.0f} ms ({cid})" for n, (s, cid) in slowest.items()]
        if slow:
            lines += ["", "slowest compile: " + "; ".join(slow)]
        findings = [f for f in self.failures if f.kind in (K.UNSOUND, K.INCOMPLETE)]
        if findings:
            lines += ["", f"first findings ({len(findings)} in all):"]
        lines += [finding_line(f) for f in findings[:10]]
        if self.meta.get("out_dir") and self.failures:
            lines.append(f"reproducers: {self.meta['out_dir']}")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        parts = [
            f"# corral fuzz report\n\n{len(self.cases)} schemas, seed {self.meta.get('seed')}, "
            f"{self.meta.get('elapsed_s', 0):.0f} s, targets {', '.join(self.targets)}.\n",
            "## Engines\n",
            *(f"- `{name}`: {format_config(c)}" for name, c in self.engines().items()),
            "\n## Per target\n",
            _md(self.target_rows()),
            *(["\n## Mask differences\n", _md(self.diff_rows())] if self.diff else []),
            "\n## Per keyword\n\nCells: unsound / incomplete / refused / schemas with the "
            "keyword. A failure counts for every keyword left in its shrunk schema.\n",
            _md(self.keyword_rows()),
            "",
            *(f"- {line}" for line in self.judged_lines()),
            "",
            findings_markdown(self.failures),
        ]
        return "\n".join(parts)

    def judged_lines(self, reasons: bool = True) -> list[str]:
        """For each target with schemas it did not judge: how many, and the commonest reason
        (the text report leaves it to the exit message, which prints it once)."""
        lines = []
        for name, st in self.targets.items():
            if st.judged == st.schemas:
                continue
            text = f"{name}: judged {st.judged} of {st.schemas} schemas"
            for what, why in (("refused", st.refused), ("not judged", st.unjudged)):
                if why:
                    reason, n = why.most_common(1)[0]
                    text += f"; {what} {sum(why.values())}"
                    text += f" (commonest, {n}×: {reason})" if reasons else ""
            lines.append(text)
        return lines


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _md(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(out)
