"""In-process engine targets: every engine Corral is measured against, each configured once.

The fuzzer (``corral fuzz``) and the benchmarks (``bench/maskbench.py``, ``bench/mask_ceiling.py``)
build their engines here, so a name stands for one configuration everywhere, and every report
prints :func:`target_config` beside its figures: an engine measured one way in one report and
another way in the next is a comparison that misleads without anyone meaning it to.

A target is anything with a ``name``, a ``config`` (see :data:`CONFIGS`), ``compile(schema) ->
handle`` (raising :class:`Refused` when the engine declines the schema) and ``matcher(handle) ->
Matcher``. Every target lays JSON out like ``json.dumps`` (``", "`` and ``": "``, no other
whitespace), so one instance text is checked against all of them.

Schema copies: ``compile`` never changes the schema it is given. Corral and xgrammar serialise it
(Corral through ``ConstraintSpec``, whose compile parses the text afresh), llguidance gets
``json.dumps`` of it, and the weakened targets edit a deep copy.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any, Protocol

import corral
from corral.fuzz.judge import iter_nodes
from corral.grammar import (
    ConstraintError,
    ConstraintSpec,
    JsonFormat,
    Matcher,
    TokenizerInfo,
    compile_constraint,
)
from corral.grammar.backends import llg as llg
from corral.grammar.backends import xgr as xgr

if TYPE_CHECKING:
    from corral.schema_cache import CompileService

FORMAT = JsonFormat.python_default()
_LAYOUT = {
    "separators": [FORMAT.item_separator, FORMAT.key_separator],
    "any_whitespace": FORMAT.flexible,
}
#: How each engine is configured. The targets below take their settings from here, and every
#: report prints these (see :func:`format_config`).
CONFIGS: dict[str, dict[str, Any]] = {
    "corral": {
        "engine": f"corral {corral.__version__}",
        "backend": f"llguidance {llg.VERSION}",
        "strict": True,
        "compile": "compile_constraint, no cache",
        **_LAYOUT,
    },
    "llguidance": {"engine": f"llguidance {llg.VERSION}", **_LAYOUT},
    "xgrammar": {"engine": f"xgrammar {xgr.VERSION}", "strict_mode": False, **_LAYOUT},
    "xgrammar-strict": {"engine": f"xgrammar {xgr.VERSION}", "strict_mode": True, **_LAYOUT},
}
BUILTIN = tuple(CONFIGS)
_WEAKENED = "-minus-"


class Refused(Exception):
    """The engine declined to compile the schema (an honest refusal, not a failure)."""


class Target(Protocol):
    name: str
    config: dict[str, Any]

    def compile(self, schema: Any) -> Any: ...

    def matcher(self, handle: Any) -> Matcher: ...


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


class CorralTarget:
    """Corral's own constraint compiler: analysis, then llguidance (strict: fail closed).

    ``service``: compile through that compile service (memory LRU, disk cache, compile workers,
    as ``corral serve`` does) instead of calling the compiler directly.
    """

    name = "corral"

    def __init__(self, tok: TokenizerInfo, service: CompileService | None = None) -> None:
        self._tok = tok
        self._service = service
        self.config = dict(CONFIGS["corral"])
        if service is not None:
            self.config["compile"] = "CompileService: memory LRU, disk cache, compile workers"

    def compile(self, schema: Any) -> Any:
        try:
            spec = ConstraintSpec.json_schema(
                schema, strict=self.config["strict"], json_format=FORMAT
            )
            if self._service is not None:
                return self._service.get_or_compile(spec)
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
        self.config = dict(CONFIGS["llguidance"])

    def compile(self, schema: Any) -> Any:
        try:
            return llg.new_prototype(llg.grammar_from_schema(schema, FORMAT), self._tok, "schema")
        except (ConstraintError, ValueError, RuntimeError) as e:
            raise Refused(_first_line(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return llg.LLGuidanceMatcher(handle, self._eos)


class XGrammarTarget:
    """Raw xgrammar, ``name`` ``xgrammar`` or ``xgrammar-strict``. ``strict_mode`` False follows
    JSON Schema (extra properties/items allowed unless the schema says otherwise); True is
    xgrammar's strict mode (its default), which forbids them."""

    def __init__(self, tok: TokenizerInfo, name: str) -> None:
        self.name = name
        self.config = dict(CONFIGS[name])
        self._tok = tok

    def compile(self, schema: Any) -> Any:
        try:
            return compile_xgrammar_schema(
                schema, FORMAT, self._tok, strict=self.config["strict_mode"]
            )
        except (RuntimeError, ValueError, TypeError) as e:
            raise Refused(_first_line(e)) from e

    def matcher(self, handle: Any) -> Matcher:
        return xgr.XGrammarMatcher(handle)


def compile_xgrammar_schema(
    schema: dict[str, Any] | bool, fmt: JsonFormat, tok: TokenizerInfo, *, strict: bool
) -> Any:
    """``schema`` compiled by raw xgrammar, laid out as ``fmt``; ``strict`` is its strict_mode."""
    return xgr.compiler_for(tok).compile_json_schema(
        json.dumps(schema),
        any_whitespace=fmt.flexible,
        separators=(fmt.item_separator, fmt.key_separator),
        strict_mode=strict,
        max_whitespace_cnt=fmt.max_whitespace if fmt.flexible else None,
    )


class WeakenedTarget:
    """A real engine made unsound on purpose: it deletes one keyword everywhere in the schema
    before compiling. ``llguidance-minus-maximum`` is the canary a fuzzer must catch."""

    def __init__(self, inner: Target, keyword: str) -> None:
        self.name = f"{inner.name}{_WEAKENED}{keyword}"
        self.config = {**inner.config, "keyword removed": keyword}
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
        return XGrammarTarget(tok, name)
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


def target_config(name: str) -> dict[str, Any]:
    """The ``config`` of the target ``make_target(name, tok)`` would build, without building it
    (a parent process reports the configuration of the engines its workers run)."""
    base, _, keyword = name.partition(_WEAKENED)
    config = dict(CONFIGS[base])
    if keyword:
        config["keyword removed"] = keyword
    return config


def format_config(config: dict[str, Any]) -> str:
    """One line: ``key value, ...``, as every report prints an engine's configuration."""
    return ", ".join(f"{k} {v if isinstance(v, str) else json.dumps(v)}" for k, v in config.items())
