"""`grammar.tag_close` on tool calls in every format Corral serves: for each prefix of an output
(free text, then a call), the closing it proposes completes an output whose call arguments are
valid (jsonschema judges) and whose call ends with the format's end; before anything is written,
a required call is owed and free text needs nothing."""

from __future__ import annotations

import json

import pytest
from budget_schemas import AREA, SCHEMAS
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from jsonschema import Draft202012Validator

from corral.api.tool_formats import FORMATS
from corral.api.tools import TOOL_JSON_FORMAT
from corral.grammar import ConstraintError, ConstraintSpec
from corral.grammar.closing.tags import TagCloser

MODES = {"auto": (True, False), "required": (False, True)}  # (free_text, at_least_one)


def closer_for(fmt, schema, mode: str) -> TagCloser:
    free, at_least_one = MODES[mode]
    tag = {
        "structures": [{"begin": b, "schema": schema, "end": fmt.end} for b in fmt.begins("f")],
        "triggers": list(fmt.triggers),
        "at_least_one": at_least_one,
        "stop_after_first": False,
        "free_text": free,
        "separator": fmt.separator,
    }
    return TagCloser.for_spec(ConstraintSpec.structural_tag_of(tag, json_format=TOOL_JSON_FORMAT))


def assert_prefixes_close(fmt, schema, mode: str, arguments) -> int:
    """Every closing proposed for a prefix of one call (after some free text in auto mode)
    completes a valid call; returns how many were proposed."""
    judge = Draft202012Validator(schema)
    lead = "Sure. " if mode == "auto" else ""
    out = lead + fmt.render_call("f", arguments)
    partial, proposed = closer_for(fmt, schema, mode).start(), 0
    for i, ch in enumerate(out):
        partial.feed(ch)
        found = partial.closing()
        if found is None:
            continue
        proposed += 1
        done = out[: i + 1] + found[0]
        begin = next((b for b in fmt.begins("f") if b in done), None)
        if begin is None:  # free text that may end here
            assert mode == "auto" and found[0] == "", done
            continue
        body = done[done.index(begin) + len(begin) :]
        assert body.endswith(fmt.end), done
        assert judge.is_valid(json.loads(body[: len(body) - len(fmt.end)])), done
    return proposed


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_call_closes_from_every_prefix(name, mode):
    fmt = FORMATS[name]
    arguments = {"shape": "t", "dimensions": {"base": 1, "height": 2}}
    calls = len(fmt.render_call("f", arguments)) + (6 if mode == "auto" else 0)
    assert assert_prefixes_close(fmt, AREA, mode, arguments) == calls


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_what_is_owed_at_the_start(name):
    fmt = FORMATS[name]
    assert closer_for(fmt, AREA, "auto").start().closing() == ("", [])
    text, cut = closer_for(fmt, AREA, "required").start().closing()
    calls = [b + '{"shape": "", "dimensions": {"radius": 0}}' + fmt.end for b in fmt.begins("f")]
    assert text == min(calls, key=len)  # llama3's bare opener is shorter than its tagged one
    assert cut == ["/0"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, name=st.sampled_from(sorted(FORMATS)), data=st.data())
def test_drawn_calls_close_validly(schema, name, data):
    schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}  # parameters
    try:
        closer_for(FORMATS[name], schema, "required")
    except ConstraintError:  # a drawn union the grammar cannot enforce exactly: not a case
        assume(False)
    arguments = data.draw(from_schema(schema))
    assert_prefixes_close(
        FORMATS[name], schema, data.draw(st.sampled_from(sorted(MODES))), arguments
    )
