"""How findings read in a report: one line each, and the Markdown section that groups the
unsound ones by the keyword the engine or server dropped (the keyword the judge says the output
breaks), each with its shrunk schema and the output."""

from __future__ import annotations

import json
from collections import defaultdict

from corral.fuzz import case as K
from corral.fuzz.case import Failure

#: The group of unsound findings that break no keyword: output that is not JSON, a wrong call.
NO_KEYWORD = "(no keyword: not JSON, or not the named call)"
SHOWN_CHARS = 1500


def finding_line(f: Failure) -> str:
    text = (f.text or "")[:120]
    dropped = f" dropped {', '.join(f.dropped)} ·" if f.dropped else ""
    where = f" → {f.reproducer}" if f.reproducer else ""
    return (
        f"{f.kind} · {f.target} ·{dropped} {f.case_id}: schema {json.dumps(f.schema)[:160]} "
        f"instance {text!r}{where}"
    )


def by_dropped_keyword(failures: list[Failure]) -> dict[str, list[Failure]]:
    """Unsound findings per dropped keyword, the most findings first (a finding that breaks two
    keywords is listed under both)."""
    groups: dict[str, list[Failure]] = defaultdict(list)
    for f in failures:
        if f.kind == K.UNSOUND:
            for kw in f.dropped or (NO_KEYWORD,):
                groups[kw].append(f)
    return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def findings_markdown(failures: list[Failure]) -> str:
    """``## Unsound findings by dropped keyword`` then ``## Incomplete findings``."""
    parts = ["## Unsound findings by dropped keyword\n"]
    groups = by_dropped_keyword(failures)
    if not groups:
        parts.append("None.\n")
    for kw, found in groups.items():
        targets = sorted({f.target for f in found})
        parts.append(f"\n### `{kw}`: {len(found)} finding(s) on {', '.join(targets)}\n")
        parts += [_finding_md(f) for f in found]
    incomplete = [f for f in failures if f.kind == K.INCOMPLETE]
    if incomplete:
        parts.append("\n## Incomplete findings\n")
        parts += [f"- {finding_line(f)}" for f in incomplete]
    return "\n".join(parts) + "\n"


def _finding_md(f: Failure) -> str:
    state = "shrunk" if f.shrunk else "as found"
    parts = [
        f"#### `{f.case_id}` on {f.target}\n",
        f"{f.detail[:300]}\n",
        f"Schema ({state}):\n\n{_block(json.dumps(f.schema, ensure_ascii=False), 'json')}",
        f"Output:\n\n{_block(f.text or '', '')}",
    ]
    if f.reproduced:
        parts.append(f"Sent again: {f.reproduced}.\n")
    if f.shrunk and f.reproduced.startswith("0 of"):
        original = json.dumps(f.original_schema, ensure_ascii=False)
        parts.append(f"Schema as first sent (the shrunk one did not reproduce):\n\n"
                     f"{_block(original, 'json')}")  # fmt: skip
    if f.reproducer:
        parts.append(f"Reproducer: `{f.reproducer}`\n")
    return "\n".join(parts)


def _block(text: str, lang: str) -> str:
    text = text[:SHOWN_CHARS] + (" …" if len(text) > SHOWN_CHARS else "")
    fence = "```" if "```" not in text else "~~~~"
    return f"{fence}{lang}\n{text}\n{fence}\n"
