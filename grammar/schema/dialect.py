"""The dialect a schema declares (``$schema``), where it changes what keywords mean.

The judge (``jsonschema``) reads a schema in the draft its ``$schema`` names, so the analysis
must too. Two differences change which instances are valid, and both are read here into their
2020-12 form before any other keyword is looked at:

* drafts 3 to 7: a ``$ref`` replaces its schema object; every keyword beside it is ignored
  (``$id`` too, so it moves no base URI);
* drafts 3 and 4: ``exclusiveMaximum``/``exclusiveMinimum`` are booleans that make
  ``maximum``/``minimum`` exclusive; 2020-12 writes the bound itself.

The rest (``items`` as an array, ``dependencies``, ``definitions``, ``id``) the analysis reads
in any dialect. A ``$schema`` that no draft claims is read as 2020-12, as the judge reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema import Draft3Validator, Draft4Validator, Draft6Validator, Draft7Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from corral.grammar.core.errors import ConstraintError
from corral.grammar.schema import rewrite_log as log


@dataclass(frozen=True)
class Dialect:
    #: keywords beside a ``$ref`` are ignored (drafts 3 to 7)
    ref_alone: bool = False
    #: ``exclusiveMaximum``/``exclusiveMinimum`` are booleans on the bounds (drafts 3 and 4)
    boolean_bounds: bool = False
    #: the judge's validator class for the dialect (checks the keywords it ignores)
    judge: type | None = None


_LATEST = Dialect()


def dialect_of(root: Any) -> Dialect:
    """The dialect of a document, as the judge picks its validator."""
    if not isinstance(root, dict) or not isinstance(root.get("$schema"), str):
        return _LATEST
    try:
        judge = validator_for(root, default=None)
    except Exception:  # an unknown meta-schema: jsonschema warns or raises, and reads 2020-12
        return _LATEST
    if judge in (Draft3Validator, Draft4Validator):
        return Dialect(ref_alone=True, boolean_bounds=True, judge=judge)
    if judge in (Draft6Validator, Draft7Validator):
        return Dialect(ref_alone=True, judge=judge)
    return _LATEST


_BOUNDS = (("exclusiveMaximum", "maximum"), ("exclusiveMinimum", "minimum"))


def as_latest(s: dict, dialect: Dialect, pointer: str, record, annotations: frozenset[str]) -> dict:
    """Schema object ``s`` with its dialect's meanings written in 2020-12 terms (``s`` itself
    when nothing differs). ``record(pointer, keyword, rewrite)`` notes each change."""
    if dialect.ref_alone and "$ref" in s:
        ignored = {k: v for k, v in s.items() if k != "$ref" and k not in annotations}
        if ignored:
            _check_form(ignored, dialect, pointer)  # ignored, but still part of a valid schema
            record(f"{pointer}/$ref", "$ref", log.REF_ALONE)
        return {"$ref": s["$ref"]}
    if dialect.boolean_bounds and any(isinstance(s.get(e), bool) for e, _ in _BOUNDS):
        s = dict(s)
        for exclusive, bound in _BOUNDS:
            flag = s.get(exclusive)
            if not isinstance(flag, bool):
                continue
            del s[exclusive]
            if flag and bound in s:
                s[exclusive] = s.pop(bound)
                record(f"{pointer}/{exclusive}", exclusive, log.BOOLEAN_BOUND)
    return s


def _check_form(keywords: dict, dialect: Dialect, pointer: str) -> None:
    """Raise ConstraintError when `keywords` break the dialect's meta-schema."""
    try:
        dialect.judge.check_schema(keywords)  # type: ignore[union-attr]
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        keyword = str(e.path[0]) if e.path else ""
        raise ConstraintError(e.message, f"{pointer}/{where}", keyword) from None
