"""In-process fuzz targets: engines that compile a JSON schema into a token-level matcher.

A target is anything with a ``name``, ``compile(schema) -> handle`` (raising :class:`Refused` when
the engine declines the schema) and ``matcher(handle) -> Matcher``. Every in-process target here
lays JSON out like ``json.dumps`` (``", "`` and ``": "``, no other whitespace), so one instance
text is checked against all of them.

Schema copies: ``compile`` never changes the schema it is given. Corral and xgrammar serialise it
(Corral through ``ConstraintSpec``, whose compile parses the text afresh), llguidance gets
``json.dumps`` of it, and the weakened targets edit a deep copy.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Protocol

from corral.fuzz.judge import iter_nodes
from corral.grammar import (
    ConstraintError,
    ConstraintSpec,
    JsonFormat,
    Matcher,
    TokenizerInfo,
    compile_constraint,
)
from corral.grammar import backend_llguidance as llg
from corral.grammar import backend_xgrammar as xgr

FORMAT = JsonFormat.python_default()
BUILTIN = ("corral", "llguidance", "xgrammar", "xgrammar-strict")
_WEAKENED = "-minus-"


class Refused(Exception):
    """The engine declined to compile the schema (an honest refusal, not a failure)."""


class Target(Protocol):
    name: str

    def compile(self, schema: Any) -> Any: ...

    def matcher(self, handle: Any) -> Matcher: ...


class CorralTarget:
    """Corral's own constraint compiler: analysis, then llguidance (strict: fail closed)."""

    name = "corral"

    def __init__(self, tok: TokenizerInfo) -> None:
        self._tok = tok

    def compile(self, schema: Any) -> Any:
        try:
            spec = ConstraintSpec.json_schema(schema, strict=True, json_format=FORMAT)
            return compile_constraint(spec, self._tok)
        except ConstraintError as e:
            raise Refused(str(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return handle.matcher()


class LLGuidanceTarget:
    """Raw llguidance: its own JSON-schema converter, no analysis in front of it."""

    name = "llguidance"

    def __init__(self, tok: TokenizerInfo) -> None:
        self._tok = tok
        self._eos = frozenset(tok.eos_token_ids)

    def compile(self, schema: Any) -> Any:
        try:
            return llg.new_prototype(llg.grammar_from_schema(schema, FORMAT), self._tok, "schema")
        except (ConstraintError, ValueError, RuntimeError) as e:
            raise Refused(str(e).strip().splitlines()[0] if str(e).strip() else repr(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return llg.LLGuidanceMatcher(handle, self._eos)


class XGrammarTarget:
    """Raw xgrammar. ``strict`` False follows JSON Schema (extra properties/items allowed
    unless the schema says otherwise); True is xgrammar's strict mode, which forbids them."""

    def __init__(self, tok: TokenizerInfo, strict: bool = False) -> None:
        self.name = "xgrammar-strict" if strict else "xgrammar"
        self._strict = strict
        self._tok = tok

    def compile(self, schema: Any) -> Any:
        try:
            return xgr.compiler_for(self._tok).compile_json_schema(
                json.dumps(schema),
                any_whitespace=False,
                separators=(FORMAT.item_separator, FORMAT.key_separator),
                strict_mode=self._strict,
            )
        except (RuntimeError, ValueError, TypeError) as e:
            raise Refused(str(e).strip().splitlines()[0] if str(e).strip() else repr(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return xgr.XGrammarMatcher(handle)


class WeakenedTarget:
    """A real engine made unsound on purpose: it deletes one keyword everywhere in the schema
    before compiling. ``llguidance-minus-maximum`` is the canary a fuzzer must catch."""

    def __init__(self, inner: Target, keyword: str) -> None:
        self.name = f"{inner.name}{_WEAKENED}{keyword}"
        self._inner = inner
        self._keyword = keyword

    def compile(self, schema: Any) -> Any:
        return self._inner.compile(drop_keyword(schema, self._keyword))

    def matcher(self, handle: Any) -> Matcher:
        return self._inner.matcher(handle)


def drop_keyword(schema: Any, keyword: str) -> Any:
    """A copy of ``schema`` with ``keyword`` removed from every schema object in it."""
    schema = copy.deepcopy(schema)
    for _, node in list(iter_nodes(schema)):
        node.pop(keyword, None)
    return schema


def make_target(name: str, tok: TokenizerInfo) -> Target:
    """Build an in-process target by name; see :func:`check_target_name` for the names."""
    if _WEAKENED in name:
        base, keyword = name.split(_WEAKENED, 1)
        return WeakenedTarget(make_target(base, tok), keyword)
    if name == "corral":
        return CorralTarget(tok)
    if name == "llguidance":
        return LLGuidanceTarget(tok)
    if name in ("xgrammar", "xgrammar-strict"):
        return XGrammarTarget(tok, strict=name == "xgrammar-strict")
    raise ValueError(check_target_name(name))


def check_target_name(name: str) -> str:
    """ "" when ``name`` is a valid in-process target, else a message saying what is."""
    base, _, keyword = name.partition(_WEAKENED)
    if base in BUILTIN and (keyword or _WEAKENED not in name):
        return ""
    return (
        f"unknown target {name!r}: use {', '.join(BUILTIN)}, an http(s):// URL of an "
        f"OpenAI-compatible server, or <target>{_WEAKENED}<keyword> (a deliberately unsound "
        f"engine, e.g. llguidance-minus-maximum)"
    )
