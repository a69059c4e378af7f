"""Hostile constraint input: deep nesting and lone surrogates are refused, never a crash.

Every entry point that walks a client's schema (the spec constructors, ``close_objects``,
``analyze_schema``, ``compile_constraint``, the router's fan-out count) answers a schema nested
64 to 50,000 levels deep quickly, with a compiled constraint or a ConstraintError naming the
limit (``recursion_depth``: llguidance's own; ``nesting_depth``: Corral's), never a
RecursionError. A lone surrogate anywhere is a ConstraintError with its JSON pointer, never a
TypeError or UnicodeEncodeError.
"""

from __future__ import annotations

import time

import pytest

from corral.grammar import ConstraintError, ConstraintKind, ConstraintSpec, compile_constraint
from corral.grammar.core.input_checks import MAX_NESTING_DEPTH
from corral.grammar.schema.analysis import analyze_schema
from corral.grammar.schema.closed_objects import close_objects
from corral.schema_cache.routing import combinator_fanout, needs_process

DEPTHS = [64, 100, 500, 5_000, 50_000]
SHAPES = ["objects", "arrays", "anyOf"]
# JSON text of each shape, nested d levels around an integer: (prefix, suffix) per level
TEXT = {
    "objects": ('{"type":"object","properties":{"a":', '},"required":["a"]}'),
    "arrays": ('{"type":"array","items":', "}"),
    "anyOf": ('{"anyOf":[', ',{"type":"null"}]}'),
}
INSTANCE = {"objects": ('{"a":', "}"), "arrays": ("[", "]"), "anyOf": ("", "")}


def nested(shape: str, depth: int) -> dict:
    """The schema, built without recursion (json.loads would hit Python's limit past ~1,000)."""
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        if shape == "objects":
            schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        elif shape == "arrays":
            schema = {"type": "array", "items": schema}
        else:
            schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


def nested_text(shape: str, depth: int) -> str:
    head, tail = TEXT[shape]
    return head * depth + '{"type":"integer"}' + tail * depth


def refused_for_depth(call) -> str | None:
    """Run ``call``; the limit of its ConstraintError, or None when it succeeded."""
    try:
        call()
    except ConstraintError as e:
        assert e.limit in ("recursion_depth", "nesting_depth"), e
        return e.limit
    return None


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_deep_schemas_compile_or_are_refused_quickly_naming_the_limit(
    llama3_tokenizer, shape, depth
):
    tok = llama3_tokenizer
    schema = nested(shape, depth)
    t0 = time.monotonic()
    limit = refused_for_depth(lambda: close_objects(schema))
    limit_text = refused_for_depth(lambda: ConstraintSpec.json_schema(nested_text(shape, depth)))
    limit_analysis = refused_for_depth(lambda: analyze_schema(schema))
    combinator_fanout(schema)
    try:
        spec = ConstraintSpec.json_schema(schema)
    except ConstraintError as e:
        assert e.limit == "nesting_depth" and limit == limit_text == limit_analysis == e.limit
        spec = None
    if spec is not None:
        needs_process(spec, 64 * 1024)
        try:
            compiled = compile_constraint(spec, tok)
        except ConstraintError as e:
            assert e.limit == "recursion_depth", e  # llguidance's own limit
        else:
            head, tail = INSTANCE[shape]
            text = head * depth + "7" + tail * depth
            m = compiled.matcher()
            assert m.accept_tokens(tok.encode(text)) == len(tok.encode(text))
            assert m.can_terminate() and m.error() is None
    assert time.monotonic() - t0 < 5.0
    # JSON levels: objects and anyOf take two per level, arrays one.
    levels = depth * (1 if shape == "arrays" else 2) + 1
    assert (spec is None) == (levels > MAX_NESTING_DEPTH)


def test_a_deep_spec_built_directly_is_refused_by_the_compiler(llama3_tokenizer):
    deep = ConstraintSpec(ConstraintKind.JSON_SCHEMA, nested_text("arrays", 50_000))
    with pytest.raises(ConstraintError) as err:
        compile_constraint(deep, llama3_tokenizer)
    assert err.value.limit == "nesting_depth"


LONE = "\ud800"
SCHEMA_PLACES = {
    "enum": ({"enum": ["ok", f"a{LONE}"]}, "/enum/1", "enum"),
    "const": ({"const": {"k": LONE}}, "/const/k", "k"),
    "pattern": ({"type": "string", "pattern": f"^{LONE}$"}, "/pattern", "pattern"),
    "property name": ({"properties": {f"x{LONE}": {}}}, "/properties", "properties"),
    "description": ({"description": LONE, "type": "string"}, "/description", "description"),
    "default": ({"type": "integer", "default": [1, LONE]}, "/default/1", "default"),
    "nested title": (
        {"properties": {"a": {"items": {"title": LONE}}}},
        "/properties/a/items/title",
        "title",
    ),
}


@pytest.mark.parametrize("place", sorted(SCHEMA_PLACES))
def test_a_lone_surrogate_anywhere_in_a_schema_is_refused_with_its_pointer(place):
    schema, pointer, keyword = SCHEMA_PLACES[place]
    for call in (
        lambda: ConstraintSpec.json_schema(schema),
        lambda: close_objects(schema),
        lambda: analyze_schema(schema),
    ):
        with pytest.raises(ConstraintError) as err:
            call()
        assert (err.value.pointer, err.value.keyword) == (pointer, keyword)
        assert "lone surrogate" in err.value.reason
        str(err.value).encode()  # the message itself is valid text
    # As JSON text, "\ud800" escapes decode to the same lone surrogate.
    with pytest.raises(ConstraintError, match="lone surrogate"):
        ConstraintSpec.json_schema('{"enum": ["\\ud800"]}')


@pytest.mark.parametrize(
    "make, pointer",
    [
        (lambda: ConstraintSpec.regex(f"ab{LONE}c"), ""),
        (lambda: ConstraintSpec.lark(f'start: "{LONE}"'), ""),
        (lambda: ConstraintSpec.ebnf(f'root ::= "{LONE}"'), ""),
        (lambda: ConstraintSpec.choice(["fine", f"x{LONE}"]), "/1"),
        (lambda: ConstraintSpec(ConstraintKind.REGEX, LONE), ""),
    ],
)
def test_a_lone_surrogate_in_a_text_constraint_is_refused(make, pointer):
    with pytest.raises(ConstraintError) as err:
        make()
    assert err.value.pointer == pointer and "lone surrogate" in err.value.reason
    assert "U+D800" in err.value.reason


def test_valid_astral_characters_still_pass(llama3_tokenizer):
    spec = ConstraintSpec.json_schema({"enum": ["\U0001f600", "ok"]})
    compiled = compile_constraint(spec, llama3_tokenizer)
    ids = llama3_tokenizer.encode('"\U0001f600"')
    assert compiled.matcher().accept_tokens(ids) == len(ids)
