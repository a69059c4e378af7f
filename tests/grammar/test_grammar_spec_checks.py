"""``ConstraintSpec.json_schema`` checks a schema while it writes the canonical text: the depth as
the canonical walk descends, lone surrogates in the text it wrote. These tests pin that this one
walk refuses exactly what ``check_document`` refuses, at the same boundary, with the same error,
in the same order, wherever the depth or the bad string is (schema keywords, the ``properties``
map, data keywords the canonical form leaves as they are)."""

from __future__ import annotations

import pytest

from corral.grammar import ConstraintError, ConstraintSpec
from corral.grammar.core.input_checks import MAX_NESTING_DEPTH, check_document


def lists(levels: int) -> list | int:
    """``levels`` JSON levels of nested arrays around an integer (0 levels: the integer)."""
    x: list | int = 0
    for _ in range(levels):
        x = [x]
    return x


def outcome(call) -> tuple:
    try:
        call()
    except ConstraintError as e:
        return ("refused", str(e), e.pointer, e.keyword, e.limit)
    return ("ok",)


# (a schema whose deepest container is at JSON level `levels + extra`, extra) per place
PLACES = {
    "allOf": lambda levels: {"allOf": lists(levels - 1)},  # the root is level 1
    "enum": lambda levels: {"enum": lists(levels - 1)},
    "const": lambda levels: {"const": {"a": lists(levels - 2)}},
    "properties": lambda levels: {"properties": {"a": {"default": lists(levels - 3)}}},
    "examples": lambda levels: {"properties": {"a": {"examples": lists(levels - 3)}}},
}


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("levels", [MAX_NESTING_DEPTH, MAX_NESTING_DEPTH + 1])
def test_the_depth_boundary_is_check_documents_wherever_the_depth_is(place, levels):
    schema = PLACES[place](levels)
    expected = outcome(lambda: check_document(schema))
    assert expected[0] == ("ok" if levels <= MAX_NESTING_DEPTH else "refused")
    got = outcome(lambda: ConstraintSpec.json_schema(schema))
    assert got == expected


@pytest.mark.parametrize(
    "schema",
    [
        {"description": "fine", "title": "\ud800"},
        {"properties": {"a\udfff": {}}},
        {"enum": ["ok", {"x": "\ud800"}]},
        {"default": {"\ud800": 1}},
    ],
)
def test_a_lone_surrogate_gets_check_documents_refusal_and_pointer(schema):
    expected = outcome(lambda: check_document(schema))
    assert expected[0] == "refused" and expected[2]
    assert outcome(lambda: ConstraintSpec.json_schema(schema)) == expected


def test_nesting_and_surrogates_are_refused_before_what_cannot_be_serialised():
    # NaN is refused as not JSON, but only once the schema passed the document checks
    bad = {"minimum": float("nan"), "title": "\ud800"}
    assert outcome(lambda: ConstraintSpec.json_schema(bad)) == outcome(lambda: check_document(bad))
    deep = {"minimum": float("nan"), "allOf": lists(MAX_NESTING_DEPTH)}
    assert outcome(lambda: ConstraintSpec.json_schema(deep))[4] == "nesting_depth"
    with pytest.raises(ConstraintError, match="cannot be serialised as JSON"):
        ConstraintSpec.json_schema({"minimum": float("nan"), "title": "fine"})
