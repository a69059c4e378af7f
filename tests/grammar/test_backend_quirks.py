"""The backends' version quirks (``corral.grammar.backends.quirks``), each driven through the real
backend: every test fails when the backend stops behaving as the quirk records, and says which
installed version that is and which workaround to revisit. So a backend upgrade names the
workarounds it makes unnecessary (or wrong).

Each quirk's test is named ``test_<backend>_<version seen>_<quirk>``; its docstring names the
tests that show Corral's output is still right in spite of the quirk (``tests/grammar/<file>::
<test>``), or a test of this file does. Nothing is mocked: grammars are compiled by llguidance
or xgrammar from the text given here, over Llama-3's tokenizer.
"""

from __future__ import annotations

import ast
import json
import random
import re
from pathlib import Path

import llguidance
import numpy as np
import pytest
import torch
import xgrammar
from grammar_walkers import merged_properties
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.backends import quirks as q
from corral.grammar.backends.llg import json_options
from corral.grammar.backends.llg_limits import _MESSAGES, classify
from corral.grammar.closing.partial_json import PartialJson
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.core.spec import JsonFormat
from corral.grammar.core.walk import accepts
from corral.grammar.regex.translate import translate_regex
from corral.grammar.schema.backend_merges import pattern_keys_first
from corral.grammar.schema.order import free_order

HERE = Path(__file__).resolve().parent


# -- driving the backends as they are -----------------------------------------------------------


def schema_grammar(schema: object) -> str:
    """llguidance's grammar of ``schema`` exactly as written: no analysis, no reordering."""
    return llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), overrides=json_options(JsonFormat())
    )


def matcher(grammar: str, tok, **limits: int):
    lim = llguidance.LLParserLimits(**limits) if limits else None
    return llguidance.LLMatcher(tok.llguidance, grammar, log_level=0, limits=lim)


def refusal(grammar: str, tok) -> str:
    """llguidance's message when it refuses ``grammar``; "" when it compiles."""
    m = matcher(grammar, tok)
    return m.get_error() if m.is_error() else ""


def backend_accepts(grammar: str, text: str, tok) -> bool:
    """Whether llguidance's masks allow ``text`` token by token, and it may end there."""
    m = matcher(grammar, tok)
    if m.is_error():
        return False
    mask = np.zeros(tok.mask_words, dtype=np.int32)
    for t in tok.encode(text):
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if not (int(mask[t >> 5]) >> (t & 31)) & 1 or not m.consume_token(t):
            return False
    return m.is_accepting() and not m.is_error()


def corral_accepts(schema: object, text: str, tok) -> bool:
    """Whether the constraint Corral compiles from ``schema`` accepts ``text``."""
    c = compile_constraint(ConstraintSpec.json_schema(schema), tok)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    return accepts(c.matcher(), tok.encode(text), bitmask)


def judge(schema: object) -> Draft202012Validator:
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def string_pattern(regex: str) -> str:
    """The grammar of a JSON string whose pattern is ``regex``, in the backend's dialect."""
    return schema_grammar({"type": "string", "pattern": regex})


# -- regexes inside JSON strings ----------------------------------------------------------------


QUOTE_LEAKS = ['^[^"]*$', "^[^\\\\]+$", '^[^"\\\\]*$', '^[^a"]+$']
QUOTED = ['a"b', "a\\b", '"', "\\"]


@pytest.mark.parametrize("pattern", QUOTE_LEAKS)
def test_llguidance_1_9_1_control_class_lets_quotes_through(pattern, llama3_tokenizer):
    """llguidance 1.9.1: a class holding every control character lets `"` and `\\` through
    inside a JSON string; the same class without NUL (``quirks.json_safe``) does not.

    Corral in spite of it: tests/grammar/test_schema_patterns.py::
    test_classes_of_every_control_character_never_let_a_quote_through and
    tests/grammar/test_schema_patterns.py::test_quotes_and_backslashes_are_judged_like_the_judge.
    """
    tok, quirk = llama3_tokenizer, q.CONTROL_CLASS_LETS_QUOTES_THROUGH
    safe = translate_regex(pattern, search=True)  # as Corral prints it: NUL left out
    assert "\\x{1}-" in safe
    raw = safe.replace("\\x{1}-", "\\x{0}-")  # the same class with NUL
    refused = [t for t in QUOTED if not re.search(pattern, t)]
    leaks = [t for t in refused if backend_accepts(string_pattern(raw), json.dumps(t), tok)]
    assert leaks, f"{pattern}: {quirk.note()}"
    # the workaround still suffices: without NUL, nothing leaks
    for text in QUOTED:
        want = re.search(pattern, text) is not None
        assert backend_accepts(string_pattern(safe), json.dumps(text), tok) == want, text
    excluded = [c for c in '"\\a' if c in pattern.split("]")[0]]
    assert q.negation_lets_quotes_through(excluded)
    assert not q.negation_lets_quotes_through([*excluded, chr(q.LEFT_OUT)])


def test_llguidance_1_9_1_one_class_alternatives_merged(llama3_tokenizer):
    """llguidance 1.9.1: one-class alternatives are merged before the JSON quoting, so two
    classes that hold every control character only together let `"` through.

    Corral in spite of it: tests/grammar/test_schema_patterns.py::
    test_classes_of_every_control_character_never_let_a_quote_through (its
    ``^(?:[\\x00-\\x0f]|[\\x10-\\x1f]|xy)+$`` case)."""
    tok, quirk = llama3_tokenizer, q.ONE_CLASS_ALTERNATIVES_MERGED
    quote = json.dumps('"')
    merged = string_pattern("^(?:[\\x{0}-\\x{f}]|[\\x{10}-\\x{1f}]|a)*$")
    assert backend_accepts(merged, quote, tok), quirk.note()
    # each class alone holds too few control characters to let it through
    for half in ("^(?:[\\x{0}-\\x{f}]|a)*$", "^(?:[\\x{10}-\\x{1f}]|a)*$"):
        assert not backend_accepts(string_pattern(half), quote, tok), half
    # Corral merges them first, so json_safe sees the class the backend sees
    printed = translate_regex("^(?:[\\x00-\\x0f]|[\\x10-\\x1f]|a)*$", search=True)
    assert "\\x{1}-\\x{1f}" in printed and not backend_accepts(string_pattern(printed), quote, tok)


# -- numbers ------------------------------------------------------------------------------------

LISTED = [1.0, 100.0, -0.0, 2.5, 0.1, 1e20, 1.5e-7, 12345678.0, 0.30000000000000004, 1e300, 7]


def test_llguidance_1_9_1_listed_numbers_spelt_plain(llama3_tokenizer):
    """llguidance 1.9.1: a listed number is written in plain decimal, an integral float as an
    integer (1.0 as `1`, `1.0` refused), as ``quirks.listed_number_text`` spells it.

    Corral in spite of it: tests/grammar/test_grammar_shortest.py::test_closing_text (listed
    numbers), tests/grammar/test_grammar_unique_open.py::
    test_refused_where_an_item_could_run_out_of_new_values (a float after the last open
    member), and test_a_listed_number_closes_as_the_backend_spells_it below."""
    tok, quirk = llama3_tokenizer, q.LISTED_NUMBERS_SPELT_PLAIN
    for value in LISTED:
        forced = matcher(schema_grammar({"const": value}), tok).compute_ff_bytes()
        assert forced == q.listed_number_text(value).encode(), f"{value!r}: {quirk.note()}"
    for value in (1.0, 1e20, 1.5e-7):
        grammar = schema_grammar({"enum": [value, "x"]})
        assert not backend_accepts(grammar, json.dumps(value), tok), f"{value!r}: {quirk.note()}"
        assert backend_accepts(grammar, q.listed_number_text(value), tok)


def test_a_listed_number_closes_as_the_backend_spells_it(llama3_tokenizer):
    """The budget closing of a listed number (``partial_values``) is text the compiled
    constraint accepts, whatever Python's own spelling of the float."""
    schema = {"enum": [1.5e-7, 1e20, 3.0]}
    for prefix, closing in (("0.0", "0000015"), ("1", "00000000000000000000"), ("3", "")):
        partial = PartialJson.empty(JsonCloser(schema))
        partial.feed(prefix)
        assert partial.closing()[0] == closing, prefix
        assert corral_accepts(schema, prefix + closing, llama3_tokenizer), prefix


# -- object layout ------------------------------------------------------------------------------


def test_llguidance_1_9_1_declared_properties_in_order(llama3_tokenizer):
    """llguidance 1.9.1: declared properties come in the schema's order, before free keys.

    Corral in spite of it: tests/grammar/test_grammar_distinct_keys.py::
    test_optional_properties_come_in_any_order and tests/grammar/test_grammar_merges.py::
    test_a_merge_elsewhere_keeps_only_its_own_order."""
    tok, quirk = llama3_tokenizer, q.DECLARED_PROPERTIES_IN_ORDER
    integer = {"type": "integer"}
    declared = schema_grammar({"type": "object", "properties": {"a": integer, "b": integer}})
    assert backend_accepts(declared, '{"a":1,"b":2}', tok)
    assert not backend_accepts(declared, '{"b":2,"a":1}', tok), quirk.note()
    for free in ({"additionalProperties": integer}, {"patternProperties": {"^z": integer}}):
        grammar = schema_grammar({"type": "object", "properties": {"a": integer}, **free})
        assert backend_accepts(grammar, '{"a":1,"z":2}', tok)
        assert not backend_accepts(grammar, '{"z":2,"a":1}', tok), f"{free}: {quirk.note()}"
    # the rewrite's pattern properties come in any order
    assert backend_accepts(
        schema_grammar({"type": "object", "patternProperties": {"^a$": integer, "^b$": integer}}),
        '{"b":2,"a":1}',
        tok,
    )


@pytest.mark.parametrize("where", ["allOf", "anyOf", "$ref"])
def test_llguidance_1_9_1_merged_properties_in_keyword_order(where, llama3_tokenizer):
    """llguidance 1.9.1: properties merged from allOf/anyOf/$ref are laid out in the order the
    keywords are written.

    Corral in spite of it: tests/grammar/test_grammar_merges.py::
    test_merged_properties_keep_the_order_the_schema_writes, tests/grammar/test_grammar_merges.py::
    test_a_merge_elsewhere_keeps_only_its_own_order, and
    test_the_canonical_form_keeps_the_layout_keywords_in_order below."""
    tok, quirk = llama3_tokenizer, q.MERGED_PROPERTIES_IN_KEYWORD_ORDER
    assert where in q.LAYOUT_KEYWORDS
    own_first = '{"ast":"B","type":"R","data":1}'
    merged_first = '{"type":"R","data":1,"ast":"B"}'
    for holder_first, (laid_out, other) in (
        (True, (own_first, merged_first)),
        (False, (merged_first, own_first)),
    ):
        grammar = schema_grammar(merged_properties(where, holder_first))
        assert backend_accepts(grammar, laid_out, tok), f"{where}: {quirk.note()}"
        assert not backend_accepts(grammar, other, tok), f"{where}: {quirk.note()}"


def test_the_canonical_form_keeps_the_layout_keywords_in_order():
    """``core.spec`` sorts keywords into the cache's canonical text but keeps the written order
    of the layout keywords; its list is the quirk's (core/spec.py keeps its own copy)."""
    from corral.grammar.core import spec

    assert spec._LAYOUT_KEYWORDS == q.LAYOUT_KEYWORDS


def test_llguidance_1_9_1_pattern_keys_read_before_applicators(llama3_tokenizer):
    """llguidance 1.9.1: pattern and additional properties written after a sibling
    allOf/anyOf/oneOf are lost to its merge (a satisfiable schema is refused).

    Corral in spite of it: tests/grammar/test_grammar_merges.py::
    test_pattern_keys_written_after_an_applicator_still_apply (and the reordered schemas below,
    which compile)."""
    tok, quirk = llama3_tokenizer, q.PATTERN_KEYS_READ_BEFORE_APPLICATORS
    pattern = {"patternProperties": {"^[a-c]$": {"type": "integer"}}}
    closed = {"additionalProperties": False}
    for applicator in sorted(q.APPLICATORS_READ_IN_ORDER):
        merge = {applicator: [{"required": ["a"]}]}
        for late in q.READ_BEFORE_APPLICATORS:
            early = closed if late == "patternProperties" else pattern
            written = pattern if late == "patternProperties" else closed
            schema = {"type": "object", **early, **merge, **written}
            grammar = schema_grammar(schema)
            assert refusal(grammar, tok) or not backend_accepts(grammar, '{"a":1}', tok), (
                f"{applicator}, {late} after it: {quirk.note()}"
            )
            reordered = pattern_keys_first(schema)
            assert list(reordered).index(late) < list(reordered).index(applicator)
            assert backend_accepts(schema_grammar(reordered), '{"a":1}', tok), (applicator, late)


def test_llguidance_1_9_1_pattern_keys_disjoint(llama3_tokenizer):
    """llguidance 1.9.1: overlapping patternProperties, own or merged, are refused.

    Corral in spite of it: test_optional_properties_stay_declared_beside_pattern_keys below,
    and tests/grammar/test_grammar_merges.py::test_a_merge_elsewhere_keeps_only_its_own_order
    (nothing is freed inside a merge)."""
    tok, quirk = llama3_tokenizer, q.PATTERN_KEYS_DISJOINT
    integer = {"type": "integer"}
    for schema in (
        {"type": "object", "patternProperties": {"^p$": integer, "^p": integer}},
        {
            "type": "object",
            "patternProperties": {"^p": integer},
            "anyOf": [{"patternProperties": {"^p$": integer}}],
        },
        {
            "type": "object",
            "allOf": [
                {"patternProperties": {"^p": integer}},
                {"patternProperties": {"^p$": integer}},
            ],
        },
    ):
        assert "not disjoint" in refusal(schema_grammar(schema), tok), f"{schema}: {quirk.note()}"


def test_optional_properties_stay_declared_beside_pattern_keys(llama3_tokenizer):
    """An object with its own pattern keys keeps its optional properties declared (a freed
    ``^p$`` could overlap them), and compiles with the judge's verdicts."""
    schema = {
        "type": "object",
        "properties": {"p": {"type": "integer"}, "q": {}},
        "patternProperties": {"^p": {"type": "integer"}},
    }
    assert free_order(schema) is None
    for text in ('{"p":1,"q":2}', '{"p":1,"pq":2}', '{"pq":"x"}', '{"p":"x"}'):
        want = judge(schema).is_valid(json.loads(text))
        assert corral_accepts(schema, text, llama3_tokenizer) == want, text


def test_llguidance_1_9_1_min_max_properties_need_all_required(llama3_tokenizer):
    """llguidance 1.9.1: min/maxProperties are refused beside optional declared properties on
    an object with free keys, and enforced once every declared property is required.

    Corral in spite of it: test_min_and_max_properties_compile_beside_optional_properties
    below."""
    tok, quirk = llama3_tokenizer, q.MIN_MAX_PROPERTIES_NEED_ALL_REQUIRED
    a = {"a": {"type": "integer"}}
    for bound in ({"minProperties": 1}, {"maxProperties": 1}):
        grammar = schema_grammar({"type": "object", "properties": a, **bound})
        assert "all keys listed" in refusal(grammar, tok), f"{bound}: {quirk.note()}"
    required = schema_grammar(
        {"type": "object", "properties": a, "required": ["a"], "maxProperties": 2}
    )
    assert backend_accepts(required, '{"a":1,"b":1}', tok)
    assert not backend_accepts(required, '{"a":1,"b":1,"c":1}', tok)


def test_min_and_max_properties_compile_beside_optional_properties(llama3_tokenizer):
    """Freed into pattern keys (``schema_order``), optional properties leave every declared
    one required, so the backend takes the bounds: the verdicts are the judge's."""
    integer = {"type": "integer"}
    cases = [
        ({"properties": {"a": integer}, "minProperties": 1}, ["{}", '{"a":1}', '{"b":1}']),
        (
            {"properties": {"a": integer, "b": {}}, "maxProperties": 1},
            ["{}", '{"a":1}', '{"b":1}', '{"a":1,"b":1}', '{"b":1,"a":1}'],
        ),
    ]
    for node, texts in cases:
        schema = {"type": "object", **node}
        for text in texts:
            want = judge(schema).is_valid(json.loads(text))
            assert corral_accepts(schema, text, llama3_tokenizer) == want, (schema, text)


def test_llguidance_1_9_1_repeated_keys_count(llama3_tokenizer):
    """llguidance 1.9.1: a repeated free key counts twice towards minProperties.

    Corral in spite of it: tests/grammar/test_grammar_walks.py::
    test_min_properties_is_not_met_by_repeating_a_key and tests/grammar/
    test_grammar_distinct_keys.py::test_min_properties_over_free_keys_is_enforced_without_repeats.
    """
    tok, quirk = llama3_tokenizer, q.REPEATED_KEYS_COUNT
    for free in (
        {"additionalProperties": {"type": "integer"}},
        {"patternProperties": {"^p": {"type": "integer"}}, "additionalProperties": False},
    ):
        grammar = schema_grammar({"type": "object", "minProperties": 2, **free})
        assert not backend_accepts(grammar, '{"p":1}', tok)
        assert backend_accepts(grammar, '{"p":1,"p":2}', tok), f"{free}: {quirk.note()}"


# -- keywords, formats, regex syntax ------------------------------------------------------------

REFUSED = {
    "oneOf": {"oneOf": [{"type": "integer"}, {"minimum": 0}]},
    "not": {"not": {"type": "integer"}},
    "if": {"if": {"type": "integer"}, "then": {"minimum": 0}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "dependentSchemas": {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^a"}},
    "uniqueItems": {"type": "array", "uniqueItems": True},
    "unevaluatedProperties": {"type": "object", "unevaluatedProperties": False},
    "unevaluatedItems": {"type": "array", "unevaluatedItems": False},
    "contains": {"type": "array", "contains": {"const": 1}},
    "minContains": {"type": "array", "contains": {"const": 1}, "minContains": 2},
    "maxContains": {"type": "array", "contains": {"const": 1}, "maxContains": 2},
}


def test_llguidance_1_9_1_refused_keywords(llama3_tokenizer):
    """llguidance 1.9.1: refuses each of ``quirks.NOT_IMPLEMENTED_KEYWORDS``.

    Corral in spite of it: tests/grammar/test_schema_backend.py::
    test_llguidance_alone_refuses_what_analysis_rewrites, tests/grammar/test_schema_analysis.py::
    test_output_uses_only_backend_keywords and tests/grammar/test_schema_analysis.py::
    test_rewrite_keeps_verdicts."""
    tok, quirk = llama3_tokenizer, q.REFUSED_KEYWORDS
    assert set(REFUSED) == q.NOT_IMPLEMENTED_KEYWORDS
    for keyword, schema in REFUSED.items():
        message = refusal(schema_grammar(schema), tok)
        assert re.search(rf"\b{keyword}\b", message), f"{keyword}: {quirk.note()}"


FORMATS = [
    ("date", "2023-02-29"),
    ("date-time", "2023-01-01T23:59:60Z"),
    ("time", "23:59:60Z"),
    ("hostname", ".".join(["a" * 60] * 5)),
]


def test_llguidance_1_9_1_loose_formats(llama3_tokenizer):
    """llguidance 1.9.1: its format regexes accept strings the judge refuses.

    Corral in spite of it: tests/grammar/test_schema_backend.py::test_formats_token_level and
    tests/grammar/test_schema_formats.py::test_format_pattern_is_a_subset_of_the_checker."""
    tok, quirk = llama3_tokenizer, q.LOOSE_FORMATS
    for name, text in FORMATS:
        schema = {"type": "string", "format": name}
        assert not judge(schema).is_valid(text), (name, text)
        assert backend_accepts(schema_grammar(schema), json.dumps(text), tok), (
            f"{name} {text!r}: {quirk.note()}"
        )
        assert not corral_accepts(schema, json.dumps(text), tok), (name, text)


def test_llguidance_1_9_1_end_anchor_only_at_end(llama3_tokenizer):
    """llguidance 1.9.1: refuses a regex with `$` anywhere but at its end.

    Corral in spite of it: tests/grammar/test_schema_patterns.py::
    test_a_pattern_with_an_end_anchor_inside_compiles_as_a_narrowing."""
    tok, quirk = llama3_tokenizer, q.END_ANCHOR_ONLY_AT_END
    assert "lookaround" in refusal(llguidance.LLMatcher.grammar_from_regex("a$b?"), tok), (
        quirk.note()
    )
    assert not refusal(llguidance.LLMatcher.grammar_from_regex("ab?$"), tok)


# -- limits and messages ------------------------------------------------------------------------

_OPTIONAL = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(20)}}


def _nested(levels: int) -> dict:
    """A schema document ``levels`` JSON levels deep."""
    schema: dict = {"type": "integer"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


#: llguidance's message fragment (``llg_limits._MESSAGES``) -> (grammar, limits to build with,
#: text to walk): each drives the backend into the limit whose message holds the fragment.
LIMIT_CASES = {
    "Current row has": (lambda: schema_grammar(_OPTIONAL), {"max_items_in_row": 10}, '{"p1":1}'),
    "Too many items": (lambda: schema_grammar(_OPTIONAL), {"step_max_items": 20}, '{"p1":1}'),
    "too many expressions constructed": (
        lambda: llguidance.LLMatcher.grammar_from_regex("a{1000000}"),
        {},
        "aaa",
    ),
    "too many states": (
        lambda: llguidance.LLMatcher.grammar_from_regex("(a|b)*a(a|b){12}"),
        {"max_lexer_states": 50},
        "ab" * 10,
    ),
    "initial lexer configuration": (
        lambda: schema_grammar(_OPTIONAL),
        {"initial_lexer_fuel": 10},
        "{",
    ),
    "grammar size": (lambda: schema_grammar(_OPTIONAL), {"max_grammar_size": 10}, "{"),
    "too deeply nested": (
        lambda: llguidance.LLMatcher.grammar_from_lark("start: " + "(" * 300 + '"a"' + ")" * 300),
        {},
        "a",
    ),
    "recursion limit exceeded": (lambda: schema_grammar(_nested(q.JSON_READER_LEVELS - 2)), {}, ""),
}


def _failure(grammar: str, limits: dict, text: str, tok) -> str:
    """llguidance's message where a matcher built with ``limits`` fails on ``text``."""
    m = matcher(grammar, tok, **limits)
    mask = np.zeros(tok.mask_words, dtype=np.int32)
    for t in tok.encode(text):
        if m.is_error():
            break
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if m.is_error() or not m.consume_token(t):
            break
    return m.get_error() if m.is_error() else ""


@pytest.mark.parametrize("fragment", sorted(LIMIT_CASES))
def test_llguidance_1_9_1_limits_only_as_text(fragment, llama3_tokenizer):
    """llguidance 1.9.1: a limit is reported only as text; each fragment of
    ``llg_limits._MESSAGES`` still names its limit.

    Corral in spite of it: tests/grammar/test_grammar_probe.py::
    test_reproducer_is_refused_naming_the_llguidance_limit and tests/grammar/
    test_grammar_recover.py::test_a_matcher_that_fails_mid_generation_says_why_and_recover_replays_it.
    """
    quirk = q.LIMITS_ONLY_AS_TEXT
    limits_named = {f: limit for f, limit, _ in _MESSAGES}
    assert set(LIMIT_CASES) == set(limits_named)  # every fragment of the table is driven here
    make, limits, text = LIMIT_CASES[fragment]
    message = _failure(make(), limits, text, llama3_tokenizer)
    assert message, f"the limit was not reached: {quirk.note()}"
    first = message.splitlines()[0]
    assert fragment in first, f"{first!r}: {quirk.note()}"
    assert classify(message)[0] == limits_named[fragment], first


def test_llguidance_1_9_1_json_reader_depth(llama3_tokenizer):
    """llguidance 1.9.1: its JSON reader stops at 128 levels: a schema of 128 is refused as it
    is read (ValueError), one of 125 to 127 when its grammar document (3 levels deeper) is,
    both with 'recursion limit exceeded'; 124 compiles.

    Corral in spite of it: tests/grammar/test_grammar_input_checks.py::
    test_deep_schemas_compile_or_are_refused_quickly_naming_the_limit."""
    tok, quirk = llama3_tokenizer, q.JSON_READER_DEPTH
    levels = q.JSON_READER_LEVELS
    assert not refusal(schema_grammar(_nested(levels - 4)), tok), quirk.note()
    for depth in (levels - 3, levels - 1):
        message = refusal(schema_grammar(_nested(depth)), tok)
        assert "recursion limit exceeded" in message, f"{depth} levels: {quirk.note()}"
        assert classify(message)[0] == "recursion_depth"
    with pytest.raises(ValueError, match="recursion limit exceeded"):
        schema_grammar(_nested(levels))
        pytest.fail(quirk.note())


# -- grammars -----------------------------------------------------------------------------------


def test_llguidance_1_9_1_lark_escaped_string_takes_newline(llama3_tokenizer):
    """llguidance 1.9.1: its ``common.ESCAPED_STRING`` admits a raw newline; Lark's (which
    ``quirks.LARK_ESCAPED_STRING`` spells) does not.

    Corral in spite of it: tests/grammar/test_grammar_grammars.py::
    test_lark_common_escaped_string_means_what_lark_says."""
    tok, quirk = llama3_tokenizer, q.LARK_ESCAPED_STRING_TAKES_NEWLINE
    builtin = llguidance.LLMatcher.grammar_from_lark(
        "start: ESCAPED_STRING\n%import common.ESCAPED_STRING\n"
    )
    assert backend_accepts(builtin, '"a\nb"', tok), quirk.note()
    lark = llguidance.LLMatcher.grammar_from_lark(
        f"start: ESCAPED_STRING\n{q.LARK_ESCAPED_STRING}\n"
    )
    assert not backend_accepts(lark, '"a\nb"', tok)
    assert backend_accepts(lark, '"a\\"b"', tok)


# -- matchers -----------------------------------------------------------------------------------


def test_llguidance_1_9_1_eos_after_stop_unrecorded(llama3_tokenizer):
    """llguidance 1.9.1: an EOS taken after the matcher stopped by itself is not recorded, so
    ``rollback(1)`` undoes the token before it.

    Corral in spite of it: tests/grammar/test_grammar_matcher.py::
    test_eos_and_the_finished_state."""
    tok, quirk = llama3_tokenizer, q.EOS_AFTER_STOP_UNRECORDED
    m = matcher(schema_grammar({"type": "object", "properties": {"a": {"const": 1}}}), tok)
    ids = tok.encode('{"a":1}')
    assert m.consume_tokens(ids) and m.is_stopped()
    assert m.consume_token(tok.eos_token_ids[0])
    assert m.rollback(1)
    assert not m.is_accepting() and not m.is_stopped(), quirk.note()  # `}` is undone


def test_llguidance_1_9_1_error_reads_as_stopped(llama3_tokenizer):
    """llguidance 1.9.1: a matcher in its error state reports ``is_stopped()``.

    Corral in spite of it: tests/grammar/test_grammar_recover.py::
    test_a_matcher_that_fails_mid_generation_says_why_and_recover_replays_it (an errored
    matcher is neither terminated nor able to terminate)."""
    tok, quirk = llama3_tokenizer, q.ERROR_READS_AS_STOPPED
    m = matcher(schema_grammar(_OPTIONAL), tok, max_items_in_row=10)
    m.consume_token(tok.encode("{")[0])
    assert m.is_error(), "the row limit was not reached"
    assert m.is_stopped(), quirk.note()


def test_llguidance_1_9_1_try_consume_hides_lexer_limit(llama3_tokenizer):
    """llguidance 1.9.1: once the lexer automaton its copies share is full, ``try_consume_tokens``
    refuses a token that needs a new state and leaves the matcher healthy; ``consume_token``
    says why.

    Corral in spite of it: tests/grammar/test_grammar_recover.py::
    test_recover_rebuilds_a_prototype_whose_shared_lexer_is_full."""
    tok, quirk = llama3_tokenizer, q.TRY_CONSUME_HIDES_LEXER_LIMIT
    rng = random.Random(0)
    words = sorted({"".join(rng.choice("abcdefghij") for _ in range(12)) for _ in range(400)})
    grammar = llguidance.LLMatcher.grammar_from_regex("(?:" + "|".join(words) + ")")
    prototype = matcher(grammar, tok, max_lexer_states=400)
    mask = np.zeros(tok.mask_words, dtype=np.int32)
    prototype.deep_copy().unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    hidden = 0
    for word in words:  # each walk adds its own states to the shared lexer, until it is full
        m = prototype.deep_copy()
        for t in tok.encode(word):
            if m.try_consume_tokens([t]) == 1:
                continue
            trial = m.deep_copy()
            if not m.is_error() and not trial.consume_token(t):
                hidden += "too many states" in trial.get_error()
            break
    assert hidden, quirk.note()


def test_llguidance_1_9_1_forced_bytes_mask_one_spelling(llama3_tokenizer):
    """llguidance 1.9.1: where bytes are forced, the mask allows only the first token of their
    canonical tokenization, while ``consume_token`` takes other spellings of them.

    Corral in spite of it: tests/grammar/test_grammar_mask_accept.py::
    test_mask_and_accept_agree_on_maskbench_instances."""
    tok, quirk = llama3_tokenizer, q.FORCED_BYTES_MASK_ONE_SPELLING
    inner = {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]}
    grammar = schema_grammar(
        {"type": "object", "properties": {"collector": inner}, "required": ["collector"]}
    )
    spellings = [t for t in (tok.encode(s) for s in ('"', '":', '":{"')) if len(t) == 1]
    assert len(spellings) == 3, "the Llama-3 tokenizer spells each of these as one token"
    m = matcher(grammar, tok)
    assert m.consume_tokens(tok.encode('{"collector'))
    mask = np.zeros(tok.mask_words, dtype=np.int32)
    m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    allowed = [bool((int(mask[t >> 5]) >> (t & 31)) & 1) for (t,) in spellings]
    assert allowed == [False, False, True], quirk.note()
    assert m.compute_ff_tokens()[:1] == spellings[2]  # the one the mask allows
    for (t,) in spellings:  # consume_token takes each spelling
        assert m.try_consume_tokens([t]) == 1 and m.rollback(1), quirk.note()


def test_xgrammar_0_2_9_raises_when_terminated(llama3_tokenizer):
    """xgrammar 0.2.9: once a stop token is accepted, the mask and the forced string raise.

    Corral in spite of it: tests/grammar/test_grammar_matcher.py::test_eos_and_the_finished_state
    (its xgrammar cases)."""
    tok, quirk = llama3_tokenizer, q.RAISES_WHEN_TERMINATED
    compiler = xgrammar.GrammarCompiler(tok.xgrammar, max_threads=1, cache_enabled=False)
    m = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps({"const": 1})))
    assert all(m.accept_token(t) for t in tok.encode("1"))
    assert m.accept_token(tok.eos_token_ids[0]) and m.is_terminated()
    bitmask = xgrammar.allocate_token_bitmask(1, tok.vocab_size)
    for ask in (lambda: m.fill_next_token_bitmask(bitmask, 0), m.find_jump_forward_string):
        with pytest.raises(RuntimeError):
            ask()
            pytest.fail(quirk.note())


# -- every quirk has its test -------------------------------------------------------------------


def _test_name(name: str, quirk: q.Quirk) -> str:
    return f"test_{quirk.backend}_{quirk.seen_on.replace('.', '_')}_{name.lower()}"


def test_every_quirk_has_a_test_naming_its_version():
    """One test per quirk, named after the backend and version, its docstring naming both."""
    assert len(q.QUIRKS) >= 19
    for name, quirk in q.QUIRKS.items():
        test = globals().get(_test_name(name, quirk))
        assert test is not None, f"{name} has no test {_test_name(name, quirk)}"
        assert f"{quirk.backend} {quirk.seen_on}" in (test.__doc__ or ""), name


def test_the_tests_the_quirk_tests_cite_exist():
    """Every ``tests/grammar/<file>.py::<test>`` a quirk test cites is a test of that file, and
    every quirk test cites at least one (here or there)."""
    cited = re.compile(r"tests/grammar/\s*(\w+\.py)::\s*(\w+)")
    own = re.compile(r"\b(test_\w+)\s+below\b")
    for name, quirk in q.QUIRKS.items():
        doc = globals()[_test_name(name, quirk)].__doc__
        refs = cited.findall(doc)
        local = own.findall(doc)
        assert refs or local, f"{name}: no test of Corral's output is cited"
        for test in local:
            assert test in globals(), test
        for file, test in refs:
            tree = ast.parse((HERE / file).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert test in names, f"{file}::{test}"
