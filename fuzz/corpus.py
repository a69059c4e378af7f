"""Schema sources: folders or files of MaskBench cases, JSON-Schema-Test-Suite groups, plain
schemas; and schemas drawn by the Hypothesis strategy.

The format is recognised per file: a ``{"schema", "tests"}`` object is a MaskBench case (and a
reproducer saved by ``corral fuzz`` is one too, so a folder of findings replays as a corpus); a list
of such objects is a Test-Suite file; anything else that is an object or a boolean is a plain
schema with no instances.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corral.fuzz.case import Case
from corral.fuzz.strategies import draw_examples, schemas


class CorpusError(ValueError):
    """A corpus path that does not exist or holds no JSON files."""


def corpus_files(paths: list[str]) -> list[Path]:
    """Every ``.json`` file under ``paths`` (files taken as given), sorted for reproducibility."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.json") if q.is_file()))
        else:
            raise CorpusError(f"corpus path {p} does not exist; pass a folder or a .json file")
    if not files:
        raise CorpusError(f"no .json files under {', '.join(paths)}")
    return files


def _is_case(x: Any) -> bool:
    return isinstance(x, dict) and "schema" in x and isinstance(x.get("tests"), list)


def _tests(raw: list[Any]) -> list[tuple[Any, bool | None]]:
    return [(t["data"], t.get("valid")) for t in raw if isinstance(t, dict) and "data" in t]


def load_file(path: Path, root_seed: int = 0) -> list[Case]:
    """The cases in one file; an unreadable file yields no cases (it is not the engines' fault)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    name = path.stem if path.parent.name in ("", ".") else f"{path.parent.name}/{path.stem}"
    seed = _seed(root_seed, name)
    if _is_case(doc):
        return [Case.from_schema(name, doc["schema"], _tests(doc["tests"]), str(path), seed)]
    if isinstance(doc, list) and doc and all(_is_case(g) for g in doc):
        return [
            Case.from_schema(f"{name}#{i}", g["schema"], _tests(g["tests"]), str(path), seed + i)
            for i, g in enumerate(doc)
        ]
    if isinstance(doc, dict | bool):
        return [Case.from_schema(name, doc, [], str(path), seed)]
    return []


def _seed(root: int, name: str) -> int:
    return random.Random(f"{root}:{name}").randrange(2**31)


def iter_corpus(paths: list[str], seed: int) -> Iterator[Case]:
    """Cases from ``paths`` with the files in a seeded random order (so a budget samples evenly)."""
    files = corpus_files(paths)
    random.Random(seed).shuffle(files)
    for f in files:
        yield from load_file(f, seed)


def iter_generated(seed: int, batch: int = 25) -> Iterator[Case]:
    """Endless schemas from :func:`corral.fuzz.strategies.schemas`, deterministic per seed."""
    for b in range(1_000_000):
        drawn = draw_examples(schemas(), batch, _seed(seed, f"batch{b}"))
        for i, schema in enumerate(drawn):
            name = f"generated/{b * batch + i}"
            yield Case.from_schema(name, schema, [], "hypothesis", _seed(seed, name))


def interleave(*sources: Iterator[Case]) -> Iterator[Case]:
    """Round-robin over sources until all are exhausted."""
    live = list(sources)
    while live:
        for src in list(live):
            case = next(src, None)
            if case is None:
                live.remove(src)
            else:
                yield case
