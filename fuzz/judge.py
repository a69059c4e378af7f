"""The judge: ``jsonschema`` decides what is valid; engines never judge themselves.

Two deliberate departures from jsonschema's defaults, both to follow the JSON Schema spec rather
than Python: ``pattern`` / ``patternProperties`` use ECMA-262-like ASCII classes (``\\d`` is
``[0-9]``, not every Unicode digit), and no ``$ref`` is ever fetched over the network (a remote
reference makes the schema unjudgeable instead).

Schema copies: none are made, and none are needed: jsonschema's validators (and
:func:`iter_nodes` / :func:`schema_keywords` here) only read the schema they are given.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError
from jsonschema_specifications import REGISTRY

#: Keys that annotate a schema without constraining instances; never counted as keywords.
ANNOTATIONS = frozenset(
    {
        "$schema", "$id", "$anchor", "$comment", "$vocabulary", "$dynamicAnchor", "title",
        "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    }
)  # fmt: skip
#: Keywords that constrain instances, across drafts 4 to 2020-12; other keys are not counted.
KEYWORDS = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems", "minItems",
        "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
        "dependentRequired", "properties", "patternProperties", "additionalProperties", "items",
        "prefixItems", "additionalItems", "contains", "propertyNames", "unevaluatedItems",
        "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
        "dependentSchemas", "dependencies", "$ref", "$defs", "definitions", "$dynamicRef",
        "$recursiveRef", "contentEncoding", "contentMediaType", "contentSchema",
    }
)  # fmt: skip
_ONE = ("not", "additionalProperties", "additionalItems", "contains", "propertyNames", "if",
        "then", "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema")  # fmt: skip
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


class Unjudgeable(Exception):
    """The judge cannot decide for this schema (bad schema, remote ref, unsupported regex)."""


@functools.lru_cache(maxsize=4096)
def _ecma(pattern: str) -> Any:
    return regex.compile(pattern, regex.ASCII)


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _ecma(patrn).search(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, pp: dict, instance: Any, schema: Any) -> Iterator:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in pp.items():
        for k, v in instance.items():
            if _ecma(patrn).search(k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


@functools.lru_cache(maxsize=16)
def _judge_class(base: type) -> type:
    return validators.extend(base, {"pattern": _pattern, "patternProperties": _pattern_properties})


class Judge:
    """Validates instances against one schema, with format checks, offline."""

    def __init__(self, schema: Any) -> None:
        base = validators.validator_for(schema, default=Draft202012Validator)
        try:
            base.check_schema(schema)
        except SchemaError as e:
            raise Unjudgeable(f"not a valid schema: {e.message}") from e
        cls = _judge_class(base)
        self._v = cls(schema, format_checker=base.FORMAT_CHECKER, registry=REGISTRY)

    def is_valid(self, instance: Any) -> bool:
        """True/False; raises :class:`Unjudgeable` when validation itself cannot finish."""
        try:
            return self._v.is_valid(instance)
        except RecursionError as e:
            raise Unjudgeable("the schema recurses without consuming the instance") from e
        except Exception as e:  # unresolvable $ref, a regex Python cannot compile, ...
            raise Unjudgeable(f"{type(e).__name__}: {e}") from e

    def error(self, instance: Any) -> str:
        """One line saying why ``instance`` is invalid (for reports)."""
        try:
            err = next(iter(self._v.iter_errors(instance)), None)
        except Exception as e:  # same failure modes as is_valid
            return f"unjudgeable: {e}"
        if err is None:
            return ""
        where = "/" + "/".join(str(p) for p in err.absolute_path)
        return f"{err.message} (at {where}, keyword {err.validator})"[:300]

    def broken(self, instance: Any) -> tuple[str, ...]:
        """The keywords ``instance`` breaks, sorted: each reported error's keyword (the deepest
        one jsonschema names: ``minimum`` under ``properties``, but ``anyOf`` for a failed
        ``anyOf``, not its branches'). Empty when it is valid or validation cannot finish."""
        try:
            return tuple(sorted({str(e.validator) for e in self._v.iter_errors(instance)}))
        except Exception:  # same failure modes as is_valid
            return ()


def broken_keywords(schema: Any, text: str) -> tuple[str, ...]:
    """The keywords the JSON ``text`` breaks under ``schema`` (see :meth:`Judge.broken`); empty
    when it is not JSON or the schema cannot be judged."""
    value, problem = parse_output(text.encode())
    if problem:
        return ()
    try:
        return Judge(schema).broken(value)
    except Unjudgeable:
        return ()


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def judge_output(judge: Judge, text: bytes) -> tuple[Any, str] | None:
    """A target's output judged: ``(value, "")`` for a valid instance, ``(value, problem)``
    otherwise; None when ``jsonschema`` cannot decide (the output then counts for nothing)."""
    value, problem = parse_output(text)
    try:
        return value, problem or judge.error(value)
    except Unjudgeable:
        return None


def parse_output(text: bytes) -> tuple[Any, str]:
    """Parse generated bytes as strict JSON: ``(value, "")`` or ``(None, problem)``.

    Invalid UTF-8, NaN/Infinity and duplicate object keys are problems: a consumer of the output
    cannot rely on any of them.
    """
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8: {e}"
    try:
        return json.loads(s, object_pairs_hook=_no_duplicates, parse_constant=_no_constant), ""
    except _DuplicateKey as e:
        return None, f"duplicate object key {str(e)!r}"
    except (ValueError, RecursionError) as e:
        return None, f"not JSON: {e}"


def dumps(value: Any) -> str:
    """The instance layout every in-process target is configured for (``json.dumps`` default).

    Raises ValueError for NaN or infinities, which have no JSON text."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def iter_nodes(schema: Any, pointer: str = "") -> Iterator[tuple[str, dict]]:
    """Every schema object in ``schema`` (the root first) with its JSON pointer."""
    if not isinstance(schema, dict):
        return
    yield pointer, schema
    for key in _ONE:
        if key in schema:
            yield from iter_nodes(schema[key], f"{pointer}/{key}")
    items = schema.get("items")
    if isinstance(items, list):  # draft 4-7 tuple form
        for i, sub in enumerate(items):
            yield from iter_nodes(sub, f"{pointer}/items/{i}")
    elif items is not None:
        yield from iter_nodes(items, f"{pointer}/items")
    for key in _LIST:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield from iter_nodes(sub, f"{pointer}/{key}/{i}")
    for key in (*_NAMED, "dependencies"):
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield from iter_nodes(sub, f"{pointer}/{key}/{_escape(name)}")


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def schema_keywords(schema: Any) -> frozenset[str]:
    """The constraining keywords used anywhere in ``schema`` (property names, annotations and
    unknown keys excluded)."""
    found: set[str] = set()
    for _, node in iter_nodes(schema):
        found.update(k for k in node if k in KEYWORDS)
    return frozenset(found)
