"""Budget closing with the real default model: whenever `max_tokens` allows the shortest valid
instance, the output is a valid instance (jsonschema is the judge), on hypothesis-drawn schemas,
budgets and seeds; below that, the report says it could not be complete."""

from __future__ import annotations

import codecs
import json

import jsonschema
import pytest
import torch
from budget_schemas import OUT_OF_ORDER, SCHEMAS
from engine_helpers import chat, make_engine
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from corral.api.tool_formats import FORMATS as TOOL_FORMATS
from corral.engine import SamplingParams
from corral.engine.constrained.budget_close import closing_after
from corral.grammar import ConstraintError, ConstraintSpec, TokenizerInfo, compile_constraint
from corral.grammar.closing.partial_json import PartialJson
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.closing.tags import TagCloser
from corral.grammar.core.runtime import BudgetClose
from corral.grammar.core.spec import JsonFormat
from corral.grammar.core.walk import accepts

FORMATS = st.sampled_from([JsonFormat(), JsonFormat.python_default(), JsonFormat(flexible=True)])
#: filled items must differ from those written (and the item being written)
UNIQUE_TAGS = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 4}
    },
    "required": ["tags"],
}


@pytest.fixture(scope="module")
def setup(smollm2):
    tok = TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=smollm2.eos_token_ids
    )
    prompt = chat(smollm2, "Write a long, detailed JSON example with many items and words.")
    return smollm2, tok, make_engine(smollm2), prompt


def tool_closer(fmt, schema, mode: str) -> TagCloser:
    """The closer of `tool_choice` `mode` over one function `get_weather` in format `fmt`."""
    from corral.api.tools import TOOL_JSON_FORMAT

    tag = {
        "structures": [
            {"begin": b, "schema": schema, "end": fmt.end} for b in fmt.begins("get_weather")
        ],
        "triggers": list(fmt.triggers),
        "at_least_one": mode == "required",
        "stop_after_first": False,
        "free_text": mode == "auto",
        "separator": fmt.separator,
    }
    spec = ConstraintSpec.structural_tag_of(tag, json_format=TOOL_JSON_FORMAT)
    return TagCloser.for_spec(spec)


def shortest_tokens(model, closer: JsonCloser) -> int:
    return len(model.tokenizer.encode(closer.shortest(closer.root), add_special_tokens=False))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, fmt=FORMATS, extra=st.integers(0, 24), seed=st.integers(0, 2**16))
@example(schema=OUT_OF_ORDER, fmt=JsonFormat.python_default(), extra=3, seed=0)
@example(schema=UNIQUE_TAGS, fmt=JsonFormat(), extra=2, seed=1)
def test_output_valid_whenever_the_budget_allows(setup, schema, fmt, extra, seed):
    model, tok, engine, prompt = setup
    spec = ConstraintSpec.json_schema(schema, json_format=fmt)
    try:
        compiled = compile_constraint(spec, tok)
    except ConstraintError:  # a drawn oneOf the grammar cannot enforce exactly
        assume(False)
    closer = JsonCloser.for_spec(spec)
    assume(closer.shortest(closer.root) is not None)  # a drawn oneOf with no instance
    need = shortest_tokens(model, closer)
    params = SamplingParams(
        max_tokens=need + extra, temperature=1.0, seed=seed, budget_close=BudgetClose(closer, tok)
    )
    (choice,) = engine.generate([prompt], params, [compiled])[0]
    jsonschema.validate(json.loads(choice.text), schema)
    assert choice.finish_reason in ("stop", "length")
    if choice.budget_close is not None and choice.budget_close.steered:
        assert choice.finish_reason == "length" and choice.budget_close.complete
    engine.check_integrity()


def test_too_small_a_budget_is_reported(setup):
    model, tok, engine, prompt = setup
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "minLength": 8}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }
    spec = ConstraintSpec.json_schema(schema)
    closer = JsonCloser.for_spec(spec)
    params = SamplingParams(
        max_tokens=shortest_tokens(model, closer) - 1,
        temperature=0,
        budget_close=BudgetClose(closer, tok),
    )
    (choice,) = engine.generate([prompt], params, [compile_constraint(spec, tok)])[0]
    assert choice.finish_reason == "length"
    report = choice.budget_close
    assert report is not None and not report.steered and not report.complete
    assert "shortest valid instance" in report.reason


def test_without_budget_close_the_output_is_cut(setup):
    """The opt-out keeps every peer's behaviour: cut at max_tokens, no report."""
    model, tok, engine, prompt = setup
    schema = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), tok)
    (choice,) = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0), [compiled])[
        0
    ]
    assert choice.finish_reason == "length" and choice.budget_close is None
    with pytest.raises(ValueError):
        json.loads(choice.text)


def test_a_schema_without_a_closable_instance_is_reported(setup):
    """`minLength: 10**9` is valid JSON Schema, but no closing is built for it: the sequence is
    not steered, and the report says so (no exception on the step loop)."""
    model, tok, engine, prompt = setup
    schema = {"type": "string", "minLength": 10**9}
    spec = ConstraintSpec.json_schema(schema)
    closer = JsonCloser.for_spec(spec)
    params = SamplingParams(max_tokens=8, temperature=0, budget_close=BudgetClose(closer, tok))
    (choice,) = engine.generate([prompt], params, [compile_constraint(spec, tok)])[0]
    assert choice.finish_reason == "length"
    report = choice.budget_close
    assert not report.steered and not report.complete and "no shortest" in report.reason


@pytest.mark.parametrize(
    "schema",
    [
        {"const": {"a": 0, "b": [1, "x"]}},
        {"enum": [{"k": 1}, {"k": 2, "v": [True]}, 7]},
        {
            "type": "object",
            "properties": {"p": {"enum": [[1, 2], [3]]}},
            "required": ["p"],
            "additionalProperties": False,
        },
    ],
)
def test_listed_objects_and_arrays_end_as_stop_with_room_to_spare(setup, schema):
    """An output taken from a list of values, well within `max_tokens`, is not budget-shaped:
    the closer follows each listed object or array (a regression: it had no closing for them,
    so steering took over at once and the output ended as "length")."""
    model, tok, engine, prompt = setup
    spec = ConstraintSpec.json_schema(schema)
    closer = JsonCloser.for_spec(spec)
    params = SamplingParams(max_tokens=60, temperature=0.0, budget_close=BudgetClose(closer, tok))
    (choice,) = engine.generate([prompt], params, [compile_constraint(spec, tok)])[0]
    jsonschema.validate(json.loads(choice.text), schema)
    assert choice.finish_reason == "stop", (choice.text, choice.budget_close)
    assert choice.budget_close is None or not choice.budget_close.steered


def test_a_split_character_closes_as_a_listed_string_spells_it(llama3_tokenizer):
    """A token may end inside a character's UTF-8 bytes. The closing then starts with the bytes
    that finish it: for a listed string, its own (before, a fixed continuation byte spelt a
    character no listed string has, no closing was known, and the output was ended at once)."""
    schema = {
        "type": "array",
        "items": {"enum": ["é", "日本", "ü", "x"]},
        "uniqueItems": True,
        "minItems": 2,
    }
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(schema))
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    bitmask = torch.zeros((1, llama3_tokenizer.mask_words), dtype=torch.int32)
    for items in (["é", "日本"], ["日本", "ü", "x"]):
        text = json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode()
        for cut in range(1, len(text)):
            decoder = codecs.getincrementaldecoder("utf-8")()
            partial = PartialJson.empty(closer)
            partial.feed(decoder.decode(text[:cut]))
            found = closing_after(partial, decoder.getstate()[0])
            assert found is not None, text[:cut]
            full = text[:cut] + found[0] + found[1].encode()
            assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(full)), full
            ids = llama3_tokenizer.encode(full.decode())
            assert accepts(compiled.matcher(), ids, bitmask), full


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["°C", "°F"]}},
    "required": ["city", "unit"],
}


@pytest.mark.parametrize("fmt_name", sorted(TOOL_FORMATS))
@pytest.mark.parametrize("mode", ["required", "auto"])
def test_a_split_character_in_a_tool_call_closes_the_call(fmt_name, mode):
    """A token ending inside a multi-byte character of a tool call's arguments (or of the free
    text before it) is closed like one inside bare JSON: the bytes that finish the character,
    then the call's closing. (Before, the tool-call parser was asked for a JSON stack it does
    not have: an AttributeError and a 500 for any non-ASCII argument at a tight budget.)"""
    fmt = TOOL_FORMATS[fmt_name]
    judge = jsonschema.Draft202012Validator(CITY)
    lead = "Voilà 😀 " if mode == "auto" else ""
    for args in ({"city": "東京", "unit": "°C"}, {"city": "Ñuñoa 😀", "unit": "°F"}):
        text = (lead + fmt.render_call("get_weather", args)).encode()
        closed = 0
        for cut in range(1, len(text)):
            decoder = codecs.getincrementaldecoder("utf-8")()
            partial = tool_closer(fmt, CITY, mode).start()
            partial.feed(decoder.decode(text[:cut]))
            pending = decoder.getstate()[0]
            found = closing_after(partial, pending)
            if found is None:
                continue
            full = (text[:cut] + found[0] + found[1].encode()).decode()
            begin = next((b for b in fmt.begins("get_weather") if b in full), None)
            if begin is None:  # free text that may end here (auto)
                assert mode == "auto" and not found[1], full
                continue
            body = full[full.index(begin) + len(begin) :]
            assert body.endswith(fmt.end), full
            assert judge.is_valid(json.loads(body[: len(body) - len(fmt.end)])), full
            closed += pending != b""
        assert closed > 0  # some cuts fell inside a character and were closed
