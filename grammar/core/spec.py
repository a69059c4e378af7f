"""ConstraintSpec: what a client asked the output to look like, with a canonical digest.

Copies: `ConstraintSpec.json_schema` serialises the schema to canonical text and never changes it;
`spec.schema()` parses a new copy per call.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any

from corral.grammar.core.errors import ConstraintError
from corral.grammar.core.input_checks import (
    MAX_NESTING_DEPTH,
    check_document,
    check_text,
    data_depth,
    is_valid_text,
    nesting_error,
)
from corral.grammar.core.structural_tag import StructuralTag, parse_structural_tag

#: Bumped whenever the meaning of a spec's fields (and so of its digest) changes.
SPEC_VERSION = 1


class ConstraintKind(StrEnum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    EBNF = "ebnf"
    LARK = "lark"
    CHOICE = "choice"
    STRUCTURAL_TAG = "structural_tag"


@dataclass(frozen=True)
class JsonFormat:
    """How JSON text is laid out: the separators and, when flexible, how much whitespace.

    Compact (``","`` and ``":"``, no whitespace) is the default. ``flexible`` allows up to
    ``max_whitespace`` whitespace characters around structural characters, so every constraint
    still terminates; the separators then only say what the compact form would be.
    """

    item_separator: str = ","
    key_separator: str = ":"
    flexible: bool = False
    max_whitespace: int = 4

    def __post_init__(self) -> None:
        if self.item_separator.strip() != "," or self.key_separator.strip() != ":":
            raise ConstraintError(
                "separators must be ',' and ':' with optional surrounding spaces",
                keyword="separators",
            )
        if not 0 <= self.max_whitespace <= 64:
            raise ConstraintError("max_whitespace must be between 0 and 64", keyword="whitespace")

    @classmethod
    def python_default(cls) -> JsonFormat:
        """The layout of ``json.dumps(x)``: ``", "`` and ``": "``."""
        return cls(item_separator=", ", key_separator=": ")


@dataclass(frozen=True)
class ConstraintSpec:
    """A constraint as the client gave it; frozen, hashable, with a process-stable digest.

    ``source`` is the canonical text of the constraint: a JSON schema serialised compactly with
    its keywords sorted, those that merge properties kept in order (see :func:`_canonical`),
    a regex, a grammar, or a JSON list of choices. ``strict`` False means lenient: keywords that
    cannot be enforced exactly are reported instead of refused.
    """

    kind: ConstraintKind
    source: str
    strict: bool = True
    json_format: JsonFormat = field(default_factory=JsonFormat)
    #: (open, close) markers of a free reasoning block before the constrained output (see
    #: :meth:`after_reasoning`); None: the constraint starts at the first output token.
    reasoning: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        # The constructors below check their input with a precise pointer; this catches a spec
        # built directly, whose digest could not even be computed with a lone surrogate in it.
        if not isinstance(self.source, str):
            raise ConstraintError(f"the {self.kind} constraint must be text", keyword=self.kind)
        check_text(self.source, str(self.kind))

    @cached_property
    def digest(self) -> str:
        """Hex sha256 over everything that changes what the constraint allows (computed once:
        every request names its constraint by it)."""
        fields: list[Any] = [
            SPEC_VERSION,
            str(self.kind),
            self.source,
            self.strict,
            self.json_format.item_separator,
            self.json_format.key_separator,
            self.json_format.flexible,
            self.json_format.max_whitespace,
        ]
        if self.reasoning is not None:  # appended only when set: older digests stay valid
            fields.append(list(self.reasoning))
        payload = json.dumps(fields, ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()

    def schema(self) -> dict[str, Any] | bool:
        """The JSON schema of a json_schema / json_object spec."""
        if self.kind is ConstraintKind.JSON_OBJECT:
            return {"type": "object"}
        if self.kind is not ConstraintKind.JSON_SCHEMA:
            raise TypeError(f"a {self.kind} constraint has no JSON schema")
        return json.loads(self.source)

    def choices(self) -> list[str]:
        if self.kind is not ConstraintKind.CHOICE:
            raise TypeError(f"a {self.kind} constraint has no choices")
        return json.loads(self.source)

    def structural_tag(self) -> StructuralTag:
        if self.kind is not ConstraintKind.STRUCTURAL_TAG:
            raise TypeError(f"a {self.kind} constraint has no structural tag")
        return parse_structural_tag(json.loads(self.source))

    def after_reasoning(self, open_marker: str, close_marker: str) -> ConstraintSpec:
        """This constraint, preceded by a free reasoning block: optionally ``open_marker``, then
        any text without ``close_marker``, then ``close_marker``; the constraint starts after it."""
        if not close_marker:
            raise ConstraintError("a reasoning block needs an end marker", keyword="reasoning")
        return replace(self, reasoning=(open_marker, close_marker))

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def json_schema(
        cls,
        schema: dict[str, Any] | bool | str,
        *,
        strict: bool = True,
        json_format: JsonFormat | None = None,
    ) -> ConstraintSpec:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema, parse_constant=_refuse_constant)
            except RecursionError:
                raise nesting_error("schema") from None
            except (json.JSONDecodeError, ValueError) as e:
                raise ConstraintError(f"the schema is not valid JSON: {e}") from e
        if not isinstance(schema, dict | bool):
            raise ConstraintError("a JSON schema must be an object or a boolean")
        # One walk for the common case: the canonical form bounds the depth as it goes, and the
        # text shows any lone surrogate. Only a refused schema pays for the precise checks,
        # which raise the same error, with the same pointer, in the same order as always.
        try:
            source, failed = _canonical_text(schema), None
        except _TooDeep:
            source, failed = None, None
        except (TypeError, ValueError) as e:
            source, failed = None, e
        if source is None or not is_valid_text(source):
            check_document(schema)  # raises for nesting or a lone surrogate
        if failed is not None:
            raise ConstraintError(f"the schema cannot be serialised as JSON: {failed}") from failed
        return cls(ConstraintKind.JSON_SCHEMA, source, strict, json_format or JsonFormat())

    @classmethod
    def json_object(cls, *, json_format: JsonFormat | None = None) -> ConstraintSpec:
        return cls(ConstraintKind.JSON_OBJECT, "", True, json_format or JsonFormat())

    @classmethod
    def regex(cls, pattern: str) -> ConstraintSpec:
        _require_text(pattern, "regex")
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> ConstraintSpec:
        """A GBNF grammar as llama.cpp and xgrammar write it (``root ::= ...``)."""
        _require_text(grammar, "ebnf")
        return cls(ConstraintKind.EBNF, grammar)

    @classmethod
    def lark(cls, grammar: str) -> ConstraintSpec:
        _require_text(grammar, "lark")
        return cls(ConstraintKind.LARK, grammar)

    @classmethod
    def structural_tag_of(
        cls,
        tag: dict[str, Any] | str,
        *,
        strict: bool = True,
        json_format: JsonFormat | None = None,
    ) -> ConstraintSpec:
        """A structural tag (see ``grammar.structural_tag``) given as JSON data or text; each
        structure's schema is checked and canonicalised as a JSON-schema constraint's is."""
        if isinstance(tag, str):
            try:
                tag = json.loads(tag, parse_constant=_refuse_constant)
            except (json.JSONDecodeError, ValueError, RecursionError) as e:
                raise ConstraintError(f"the structural tag is not valid JSON: {e}") from e
        check_document(tag)
        parsed = parse_structural_tag(tag)
        source = json.dumps(
            _canonical_tag(parsed.to_json()), ensure_ascii=False, separators=(",", ":")
        )
        return cls(ConstraintKind.STRUCTURAL_TAG, source, strict, json_format or JsonFormat())

    @classmethod
    def choice(cls, choices: list[str]) -> ConstraintSpec:
        if (
            not isinstance(choices, list | tuple)
            or not choices
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ConstraintError("choice needs a non-empty list of strings", keyword="choice")
        for i, c in enumerate(choices):
            check_text(c, "choice", pointer=f"/{i}")
        return cls(ConstraintKind.CHOICE, json.dumps(list(choices), ensure_ascii=False))


def _canonical_tag(tag: dict[str, Any]) -> dict[str, Any]:
    structures = [s | {"schema": _canonical(s["schema"])} for s in tag["structures"]]
    return tag | {"structures": structures}


def _require_text(text: str, what: str) -> None:
    if not isinstance(text, str) or not text:
        raise ConstraintError(f"the {what} constraint must be a non-empty string", keyword=what)
    check_text(text, what)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# Keywords whose values are JSON data, not schemas: left exactly as given.
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
# Keywords an object's properties are merged from. Where several sit side by side, llguidance
# lays the merged properties out in the order the keywords come: `{"properties": {"a": ..},
# "anyOf": [{"properties": {"b": ..}}]}` generates a before b, with `anyOf` first b before a.
# (`oneOf`, `if`, `not` and dependencies are rewritten into conjuncts placed after all of these,
# wherever they stand, so their position changes nothing.)
_LAYOUT_KEYWORDS = frozenset(("properties", "allOf", "anyOf", "$ref"))
_CONTAINERS = (dict, list)


class _TooDeep(Exception):
    """A container deeper than ``MAX_NESTING_DEPTH``: ``check_document`` words the refusal."""


def _canonical_text(schema: Any) -> str:
    """The canonical text of a schema (see :func:`_canonical`); raises _TooDeep, or the
    TypeError / ValueError of something that is not JSON."""
    return json.dumps(
        _canonical(schema), ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )


def _canonical(node: Any, depth: int = 1) -> Any:
    """Sort schema keywords, so keyword order does not split the cache, but keep the member order
    of ``properties`` and the relative order of the keywords properties are merged from
    (:func:`_keyword_order`): the backends lay out object properties in the order the schema
    declares them, so that order is part of the constraint.

    ``depth`` is the node's JSON level, counted as ``check_document`` counts it: a container
    deeper than ``MAX_NESTING_DEPTH`` raises _TooDeep before the recursion goes any further."""
    if isinstance(node, list):
        if depth > MAX_NESTING_DEPTH:
            raise _TooDeep
        return [_canonical(x, depth + 1) if isinstance(x, _CONTAINERS) else x for x in node]
    if not isinstance(node, dict):
        return node
    if depth > MAX_NESTING_DEPTH:
        raise _TooDeep
    out = {}
    for key in _keyword_order(node):
        value = node[key]
        if not isinstance(value, _CONTAINERS):  # a scalar is its own canonical form
            out[key] = value
        elif key in _DATA_KEYWORDS:
            if data_depth(value) + depth > MAX_NESTING_DEPTH:
                raise _TooDeep
            out[key] = value
        elif key == "properties" and isinstance(value, dict):
            if depth + 1 > MAX_NESTING_DEPTH:
                raise _TooDeep
            out[key] = {name: _canonical(sub, depth + 2) for name, sub in value.items()}
        else:
            out[key] = _canonical(value, depth + 1)
    return out


def _keyword_order(node: dict) -> list[str]:
    """``node``'s keywords sorted, except that the layout keywords (``_LAYOUT_KEYWORDS``) fill
    their sorted places in the order the client wrote them: sorting them would move the
    properties merged from ``allOf``/``anyOf``/``$ref`` before or after the node's own."""
    layout = iter([key for key in node if key in _LAYOUT_KEYWORDS])
    return [next(layout) if key in _LAYOUT_KEYWORDS else key for key in sorted(node)]
