"""The engines MaskBench measures, as run inside one worker process each.

Every engine turns a JSON schema into a per-instance ``Matcher`` (Corral's interface, so the
token-by-token check is the same code for all); the time to first mask covers the compile (or
the cache load) and the first mask of a fresh matcher.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from corral.grammar import ConstraintError, ConstraintSpec, JsonFormat, Matcher, TokenizerInfo
from corral.grammar import backend_llguidance as llg
from corral.grammar import backend_xgrammar as xgr
from corral.grammar.walk import check_instances

LAYOUT = JsonFormat.python_default()  # MaskBench tokenizes json.dumps(data): ", " and ": "


class Refused(Exception):
    """The engine would not compile the schema (a compile error in the report)."""


class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, tok: TokenizerInfo, cache_dir: str | None) -> None:
        self.tok = tok
        self.eos = frozenset(tok.eos_token_ids)

    def compile(self, schema: Any) -> Any:
        try:
            grammar = llg.grammar_from_schema(schema, LAYOUT)
            return llg.new_prototype(grammar, self.tok, "schema")
        except (ConstraintError, ValueError) as e:
            raise Refused(str(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return llg.LLGuidanceMatcher(handle, self.eos)


class XGrammarEngine:
    name = "xgrammar"

    def __init__(self, tok: TokenizerInfo, cache_dir: str | None) -> None:
        self.tok = tok

    def compile(self, schema: Any) -> Any:
        try:
            return xgr.compile_schema(schema, LAYOUT, self.tok)
        except Exception as e:  # xgrammar raises RuntimeError/ValueError for what it refuses
            raise Refused(str(e).strip().splitlines()[0] if str(e).strip() else repr(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return xgr.XGrammarMatcher(handle)


class CorralEngine:
    """Corral through its compile service: memory LRU -> disk cache -> compile."""

    name = "corral"

    def __init__(self, tok: TokenizerInfo, cache_dir: str | None) -> None:
        from corral.schema_cache import CacheConfig, CompileService

        # configured as `corral serve` configures it: compile workers start with the service
        self.service = CompileService(tok, CacheConfig(root=cache_dir, prestart_workers=True))

    def compile(self, schema: Any) -> Any:
        try:
            spec = ConstraintSpec.json_schema(schema, json_format=LAYOUT)
            return self.service.get_or_compile(spec)
        except ConstraintError as e:
            raise Refused(str(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return handle.matcher()


ENGINES = {"corral": CorralEngine, "llguidance": LLGuidanceEngine, "xgrammar": XGrammarEngine}


def run_schema(engine: Any, tok: TokenizerInfo, path: str) -> dict[str, Any]:
    """Compile one MaskBench file and check every test instance token by token."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    result: dict[str, Any] = {"file": os.path.basename(path), "masks_us": []}
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    t0 = time.perf_counter()
    try:
        handle = engine.compile(doc["schema"])
        first = engine.matcher(handle)
        first.fill_mask(bitmask, 0)
    except Refused as e:
        result.update(status="compile_error", error=str(e)[:300])
        return result
    result["ttfm_ms"] = (time.perf_counter() - t0) * 1e3
    instances = [(t["data"], t["valid"]) for t in doc.get("tests", [])]
    false_accept, false_reject = check_instances(
        lambda: engine.matcher(handle), instances, tok.encode, bitmask, result["masks_us"]
    )
    result.update(status="ok", false_accept=false_accept, false_reject=false_reject)
    return result
