"""Well-formedness checks of keyword values (a malformed schema is the client's mistake).

Copies: none; these checks only read the schemas they are given, and the `check_*` helpers return
the value given, not a copy.
"""

from __future__ import annotations

from typing import Any

from corral.grammar.core.errors import ConstraintError
from corral.grammar.schema.facts import TYPE_NAMES


def check_type(value: Any, where: str) -> Any:
    """A valid `type` value (a type name or a list of distinct ones)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or any(n not in TYPE_NAMES for n in names):
        raise ConstraintError(
            f"type must be one of {sorted(TYPE_NAMES)} or a list of them", where, "type"
        )
    if len(set(names)) != len(names):
        raise ConstraintError("type must not list a type twice", where, "type")
    return value


def check_list(value: Any, where: str, key: str, strings: bool = False) -> list:
    """A list value (of strings when asked); combinator lists must not be empty."""
    if not isinstance(value, list) or (strings and not all(isinstance(v, str) for v in value)):
        raise ConstraintError(
            f"{key} must be an array" + (" of strings" if strings else ""), where, key
        )
    if key in ("allOf", "anyOf", "oneOf") and not value:
        raise ConstraintError(f"{key} must not be empty", where, key)
    return value


def check_count(value: Any, where: str, key: str) -> int:
    """A non-negative integer (1.0 counts as 1)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConstraintError(f"{key} must be a non-negative integer", where, key)
    return value


def check_number(value: Any, where: str, key: str) -> int | float:
    """A number; `multipleOf` must be positive."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConstraintError(f"{key} must be a number", where, key)
    if key == "multipleOf" and value <= 0:
        raise ConstraintError("multipleOf must be greater than 0", where, key)
    return value
