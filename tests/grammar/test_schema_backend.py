"""Rewritten schemas through llguidance, token by token (Llama-3 tokenizer): never a false accept."""

import json

import pytest

from corral.fuzz.tokenizers import llama3_tokenizer_path
from corral.grammar.core.errors import ConstraintError
from corral.grammar.schema.analysis import analyze_schema

llguidance = pytest.importorskip("llguidance")
from test_schema_analysis import POOL, REWRITES, judge  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


@pytest.fixture(scope="module")
def tok():
    path = llama3_tokenizer_path()
    hf = Tokenizer.from_file(path)
    ll = llguidance.LLTokenizer(open(path).read(), n_vocab=128256, eos_token=[128001, 128009])
    return hf, ll


def accepts(tok, schema, value) -> bool:
    hf, ll = tok
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=OPTIONS)
    m = llguidance.LLMatcher(ll, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    ids = hf.encode(json.dumps(value, ensure_ascii=False), add_special_tokens=False).ids
    return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


def test_rewrites_compile_and_never_accept_invalid(tok):
    agree = total = 0
    for schema in REWRITES:
        rewritten = analyze_schema(schema).schema
        valid = judge(schema)
        for x in POOL:
            got, want = accepts(tok, rewritten, x), valid.is_valid(x)
            assert not (got and not want), (schema, x)
            agree += got == want
            total += 1
    # the backend may still reject valid instances (quirks.DECLARED_PROPERTIES_IN_ORDER,
    # quirks.LISTED_NUMBERS_SPELT_PLAIN: fixed property order, 1.0 as 1)
    assert agree >= 0.97 * total


@pytest.mark.parametrize(
    "schema,good,bad",
    [
        ({"type": "string", "format": "date"}, ["2024-02-29"], ["2023-02-29", "2024-02-29\n"]),
        (
            {"type": "string", "format": "date-time"},
            ["2023-01-01T00:00:00Z"],
            ["2023-01-01T00:00:60Z"],
        ),
        ({"type": "string", "format": "hostname"}, ["example.com"], [".".join(["a" * 60] * 5)]),
        ({"type": "string", "format": "url"}, ["not really a url"], [1]),
    ],
)
def test_formats_token_level(tok, schema, good, bad):
    rewritten = analyze_schema(schema).schema
    for x in good:
        assert accepts(tok, rewritten, x), x
    for x in bad:
        assert not accepts(tok, rewritten, x), x


def test_llguidance_alone_refuses_what_analysis_rewrites(tok):
    """The rewrites reach schemas the backend refuses on its own (the point of the analysis)."""
    schema = {"oneOf": [{"required": ["x"]}, {"required": ["error"]}], "type": "object"}
    m = llguidance.LLMatcher(
        tok[1], llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=OPTIONS)
    )
    assert m.is_error()
    assert accepts(tok, analyze_schema(schema).schema, {"x": 1})
    assert not accepts(tok, analyze_schema(schema).schema, {"x": 1, "error": 2})
    with pytest.raises(ConstraintError):
        analyze_schema({"type": "array", "contains": {"const": 1}})
