"""Warming the cache ahead of traffic: schema files in, compiled entries on disk.

``corral cache warm PATH…`` reads plain JSON schemas, MaskBench files (``{"schema": …,
"tests": …}``) and JSON-Schema-Test-Suite files (a list of ``{"schema": …}`` groups).

Copies: each file is parsed once and its schemas handed to `ConstraintSpec.json_schema`, which
serialises them; compiles run on fresh parses of that text.

Which tokenizer to warm for is the caller's business (``corral/cli_cache.py``: the served model's):
entries are per tokenizer fingerprint, and this package knows no models.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.grammar import ConstraintError, ConstraintSpec
from corral.schema_cache.service import CompileService


def schema_files(paths: Iterable[str | Path]) -> list[Path]:
    """The ``.json`` files named, and those anywhere under the folders named, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(x for x in p.rglob("*.json") if x.is_file()))
        elif p.is_file():
            found.append(p)
        else:
            raise FileNotFoundError(f"{p} is neither a file nor a folder")
    return found


def schemas_in(document: Any) -> Iterator[dict | bool]:
    """The schemas a file holds: itself, its ``schema`` field, or each list item's."""
    if isinstance(document, list):
        for item in document:
            yield from schemas_in(item)
    elif isinstance(document, dict) and isinstance(document.get("schema"), dict | bool):
        yield document["schema"]  # MaskBench / test-suite wrapper: "schema" is no keyword
    elif isinstance(document, dict | bool):
        yield document


@dataclass
class WarmReport:
    """What a warm run did: counts, and why constraints were refused or failed."""

    compiled: int = 0
    cached: int = 0
    refused: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    unreadable: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.compiled + self.cached + sum(self.refused.values()) + sum(self.errors.values())


def load_specs(
    files: Iterable[Path], report: WarmReport, *, strict: bool = True
) -> list[ConstraintSpec]:
    specs = []
    for path in files:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            report.unreadable.append(f"{path}: {e}")
            continue
        for schema in schemas_in(document):
            try:
                specs.append(ConstraintSpec.json_schema(schema, strict=strict))
            except ConstraintError as e:
                report.refused[e.reason] += 1
    return specs


def warm(
    service: CompileService, specs: Iterable[ConstraintSpec], report: WarmReport
) -> WarmReport:
    """Compile each spec into the cache, counting what was compiled, cached or refused."""
    for spec in specs:
        try:
            found = service.lookup(spec)
        except ConstraintError as e:
            report.refused[_first_line(e.reason)] += 1
        except Exception as e:  # a server bug: counted and shown, the run goes on
            report.errors[f"{type(e).__name__}: {_first_line(str(e))}"] += 1
        else:
            if found.source == "compiled":
                report.compiled += 1
            else:
                report.cached += 1
    return report


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(no message)"
    return line if len(line) <= limit else line[: limit - 1] + "…"
