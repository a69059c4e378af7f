"""Budget closing with the real default model: whenever `max_tokens` allows the shortest valid
instance, the output is a valid instance (jsonschema is the judge), on hypothesis-drawn schemas,
budgets and seeds; below that, the report says it could not be complete."""

from __future__ import annotations

import json

import jsonschema
import pytest
from engine_helpers import chat, make_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.engine import SamplingParams
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint
from corral.grammar.shortest import JsonCloser
from corral.grammar.spec import JsonFormat

FORMATS = st.sampled_from([JsonFormat(), JsonFormat.python_default(), JsonFormat(flexible=True)])
NAMES = st.sampled_from(["id", "name", "tags", "a", "b_c", "score", "note"])


def leaf() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 4)),
        st.builds(
            lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 1000},
            st.integers(-50, 50),
        ),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.just({"enum": ["red", "green", "blue"]}),
        st.just({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}),
        st.just({"type": "number", "minimum": 1.5}),
    )


def container(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    arrays = st.builds(
        lambda items, n: {"type": "array", "items": items, "minItems": n},
        children,
        st.integers(0, 2),
    )
    objects = st.dictionaries(NAMES, children, min_size=1, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req}
        )
    )
    return st.one_of(arrays, objects)


SCHEMAS = st.recursive(leaf(), container, max_leaves=6).filter(lambda s: "type" in s)


@pytest.fixture(scope="module")
def setup(smollm2):
    tok = TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=smollm2.eos_token_ids
    )
    prompt = chat(smollm2, "Write a long, detailed JSON example with many items and words.")
    return smollm2, tok, make_engine(smollm2), prompt


def shortest_tokens(model, closer: JsonCloser) -> int:
    return len(model.tokenizer.encode(closer.shortest(closer.root), add_special_tokens=False))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, fmt=FORMATS, extra=st.integers(0, 24), seed=st.integers(0, 2**16))
def test_output_valid_whenever_the_budget_allows(setup, schema, fmt, extra, seed):
    model, tok, engine, prompt = setup
    spec = ConstraintSpec.json_schema(schema, json_format=fmt)
    closer = JsonCloser.for_spec(spec)
    need = shortest_tokens(model, closer)
    params = SamplingParams(
        max_tokens=need + extra, temperature=1.0, seed=seed, budget_close=closer
    )
    (choice,) = engine.generate([prompt], params, [compile_constraint(spec, tok)])[0]
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
        max_tokens=shortest_tokens(model, closer) - 1, temperature=0, budget_close=closer
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
