"""Warming the cache ahead of traffic: schema files in, compiled entries in the cache.

``corral cache warm PATH…`` reads plain JSON schemas, MaskBench files (``{"schema": …,
"tests": …}``) and JSON-Schema-Test-Suite files (a list of ``{"schema": …}`` groups).

How one schema is compiled is the caller's business (``corral/warming.py``): a warmed entry is
only ever hit if it was compiled the way a request compiles it — the served model's tokenizer,
the server's object closing and reasoning wrapper — so the caller sends each schema through the
API's own constraint path, in a running server or in its own process. This package knows no
models and no requests; it counts what the compiles did.

Copies: each file is parsed once; the schemas go to the caller's ``compile_one`` as parsed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


class Refused(Exception):
    """A schema the constraint path refuses (the 400 a request with it gets): its message."""


#: Compiles one schema into the cache; returns where its entry came from ("compiled" when it
#: was compiled now) or raises :class:`Refused`.
CompileOne = Callable[[dict | bool], str]


def load_schemas(files: Iterable[Path], report: WarmReport) -> list[dict | bool]:
    """Every schema in ``files``; a file that is not JSON is noted in ``report``."""
    schemas: list[dict | bool] = []
    for path in files:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            report.unreadable.append(f"{path}: {type(e).__name__}: {_first_line(str(e))}")
            continue
        schemas.extend(schemas_in(document))
    return schemas


def warm(compile_one: CompileOne, schemas: Iterable[dict | bool], report: WarmReport) -> WarmReport:
    """Compile each schema into the cache, counting what was compiled, cached or refused."""
    for schema in schemas:
        try:
            source = compile_one(schema)
        except Refused as e:
            report.refused[_first_line(str(e))] += 1
        except Exception as e:  # a bug or a server error: counted and shown, the run goes on
            report.errors[f"{type(e).__name__}: {_first_line(str(e))}"] += 1
        else:
            if source == "compiled":
                report.compiled += 1
            else:
                report.cached += 1
    return report


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(no message)"
    return line if len(line) <= limit else line[: limit - 1] + "…"
