"""Regexes handed to the backend, size refusals and finite folding in the schema analysis.

The judge is `jsonschema` (Python `re` semantics); the backend is llguidance, driven token by
token with the real Llama-3 tokenizer.
"""

import json
import random
import re
import time

import pytest
import torch

from corral.fuzz.tokenizers import llama3_tokenizer_path
from corral.grammar import ConstraintSpec, JsonFormat, compile_constraint
from corral.grammar.core.errors import ConstraintError
from corral.grammar.core.walk import accepts as walk_accepts
from corral.grammar.regex.algebra import RegexAlgebra
from corral.grammar.regex.translate import translate_regex
from corral.grammar.schema.analysis import analyze_schema
from corral.grammar.schema.patterns import exact_shorthands
from corral.grammar.schema.size import MAX_ALTERNATIVES

llguidance = pytest.importorskip("llguidance")
from test_schema_analysis import POOL, assert_equivalent, judge  # noqa: E402
from test_schema_backend import accepts  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ARABIC_THREE = "\u0663"  # a Unicode digit: Python's \d matches it, ASCII \d does not


@pytest.fixture(scope="module")
def tok():
    path = llama3_tokenizer_path()
    hf = Tokenizer.from_file(path)
    ll = llguidance.LLTokenizer(open(path).read(), n_vocab=128256, eos_token=[128001, 128009])
    return hf, ll


@pytest.mark.parametrize(
    "pattern",
    [
        r"^\d+$",
        r"[a-f\d]",
        r"[^\d]",
        r"\\d",
        r"[\\d]",
        r"[]\w]",
        r"^[\w\.\d\_]+$",
        r"[a-zA-Z0-9\s+_-]",
        r"^\d+(\.\d+)*(-\w+)?$",
        r"[\d-]",
        r"[\D\w]",
    ],
)
def test_exact_shorthands_keep_python_meaning(pattern):
    rewritten = exact_shorthands(pattern)
    alphabet = ["a", "1", ARABIC_THREE, "_", "-", " ", "\u00a0", "é", "\\", ".", "]", "\n"]
    rng = random.Random(pattern)
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
        assert bool(re.search(pattern, s)) == bool(re.search(rewritten, s)), (rewritten, s)


def test_negated_shorthand_pattern_is_exact_through_the_backend(tok):
    schema = {"type": "string", "pattern": r"^\D$"}
    rewritten = analyze_schema(schema).schema
    assert judge(schema).is_valid("a") and accepts(tok, rewritten, "a")
    assert not judge(schema).is_valid(ARABIC_THREE)
    assert not accepts(tok, rewritten, ARABIC_THREE)


def test_pattern_properties_keys_are_exact(tok):
    """A key Python's \\d matches must get the pattern's schema, not additionalProperties."""
    schema = {"type": "object", "patternProperties": {r"^\d$": {"type": "integer"}}}
    rewritten = analyze_schema(schema).schema
    for instance in ({ARABIC_THREE: "x"}, {"3": "x"}):
        assert not judge(schema).is_valid(instance)
        assert not accepts(tok, rewritten, instance), instance
    assert accepts(tok, rewritten, {ARABIC_THREE: 1})
    assert accepts(tok, rewritten, {"x": "free"})


@pytest.mark.parametrize(
    "pattern,good,bad",
    [("a", ["xay", "a"], ["b"]), ("^a", ["ab"], ["xa"]), ("a$", ["xa"], ["ab"])],
)
def test_search_semantics_survive_translation(tok, pattern, good, bad):
    rewritten = analyze_schema({"type": "string", "pattern": pattern}).schema
    for s in good:
        assert accepts(tok, rewritten, s), s
    for s in bad:
        assert not accepts(tok, rewritten, s), s


@pytest.mark.parametrize(
    "pattern",
    [
        "a{1,16}",
        "a+b*",
        "(ab)+c{2,5}",
        "(a+b)",
        "(?:a+b)+",
        "^a+",
        "a+$",
        "^a{2,}b?$",
        "a*",
        "b|a+c?|^c{3,}",
        "a+?b",
        "ab{0,2}a",
        "(a|b)+",
    ],
)
def test_search_ends_are_cut_without_changing_what_is_found(pattern):
    """`translate_regex(search=True)` cuts repetitions at unanchored ends to their least count;
    over letters it prints Python syntax, so Python judges both on the same strings."""
    cut = translate_regex(pattern, search=True)
    rng = random.Random(pattern)
    for _ in range(2000):
        s = "".join(rng.choice("abc") for _ in range(rng.randint(0, 7)))
        assert bool(re.search(pattern, s)) == bool(re.search(cut, s)), (cut, s)
    assert translate_regex("a{1,16}", search=True) == "a"
    assert translate_regex("^a{1,16}$", search=True) == translate_regex("^a{1,16}$")


def test_unanchored_counted_key_pattern_stays_within_the_lexer(llama3_tokenizer):
    """`\\w{1,16}` unanchored, over all of Unicode's word characters, next to closed objects
    with many optional keys ran llguidance's lexer out of expressions while it computed the mask
    at the third character of a key (MaskBench Github_hard---o12613); searched as `\\w` it is
    the same keys. Walked mask by mask, as generation does."""
    wireless = {k: {"type": "string"} for k in ("nasid", "acct_server", "acct_secret")}
    wireless |= {k: {"type": "boolean"} for k in ("hidden", "isolate")}
    wireless |= {"ssid": {"type": "string", "maxLength": 32}, "maxassoc": {"type": "integer"}}
    wireless |= {"key": {"type": "string", "minLength": 8}, "acct_interval": {"minimum": 1}}
    interface = {
        "type": "object",
        "properties": {
            "type": {"enum": ["vlan", "wifi-ap"]},
            "wireless": {"type": "object", "properties": wireless, "additionalProperties": False},
        },
        "required": ["type"],
        "additionalProperties": False,
    }
    schema = {"type": "object", "patternProperties": {r"\w{1,16}": interface}}
    tok = llama3_tokenizer
    spec = ConstraintSpec.json_schema(schema, json_format=JsonFormat.python_default())
    compiled = compile_constraint(spec, tok)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)

    def walks(instance) -> bool:
        text = json.dumps(instance, ensure_ascii=False)
        return walk_accepts(compiled.matcher(), tok.encode(text), bitmask)

    good = [
        {"eth0": {"type": "vlan"}},
        {"wlan0": {"type": "wifi-ap", "wireless": {"ssid": "x", "key": "password1"}}},
        {"\u00e9": {"type": "vlan"}},
        {"-": 5},
    ]
    for instance in good:
        assert judge(schema).is_valid(instance) and walks(instance), instance
    for instance in ({"\u00e9": 5}, {"-x": 5}, {"eth0": {"type": "lo"}}):
        assert not judge(schema).is_valid(instance), instance
        assert not walks(instance), instance


def test_look_around_is_refused_or_reported():
    # a negative look-ahead after the start (`^(?!x)` alone has a regular meaning: rewritten)
    schema = {"properties": {"a": {"type": "string", "pattern": "a(?!x)"}}}
    with pytest.raises(ConstraintError) as e:
        analyze_schema(schema)
    assert (e.value.pointer, e.value.keyword) == ("/properties/a/pattern", "pattern")
    plan = analyze_schema(schema, lenient=True)
    assert [u.keyword for u in plan.unenforced] == ["pattern"]
    assert "pattern" not in plan.schema["properties"]["a"]
    with pytest.raises(ConstraintError):  # not a regex at all: a mistake even when lenient
        analyze_schema({"pattern": "(("}, lenient=True)


def test_translations_are_cached():
    algebra = RegexAlgebra()  # the owner of the translations: kept across these analyses
    analyze_schema({"type": "string", "pattern": r"^\w+@\d$"}, algebra=algebra)
    start = time.perf_counter()
    for _ in range(200):
        analyze_schema({"type": "string", "pattern": r"^\w+@\d$"}, algebra=algebra)
    assert (time.perf_counter() - start) / 200 < 0.005
    assert algebra.hits["translate"] >= 200


def test_overlapping_one_of_past_the_limit_is_refused_by_name():
    branches = [{"required": [f"k{i}"], "properties": {f"p{i}": {"minimum": i}}} for i in range(8)]
    schema = {"type": "object", "oneOf": branches}
    with pytest.raises(ConstraintError) as e:
        analyze_schema(schema)
    assert e.value.keyword == "oneOf" and e.value.pointer == "/oneOf"
    assert "8 overlapping branches" in e.value.reason and str(MAX_ALTERNATIVES) in e.value.reason
    plan = analyze_schema(schema, lenient=True)
    assert [u.keyword for u in plan.unenforced] == ["oneOf"]


def test_small_overlapping_one_of_is_still_rewritten():
    schema = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert_equivalent(schema)


def test_finite_conjunction_folds_into_one_enum(tok):
    schema = {
        "allOf": [{"$ref": "#/$defs/x"}, {"enum": [2, 3, 9, "s"]}],
        "if": {"maximum": 3},
        "then": {"minimum": 3},
        "$defs": {"x": {"enum": [1, 2, 3, 9, "s"]}},
    }
    rewritten = assert_equivalent(schema, [1, 2, 3, 9, "s", 3.0, None])
    assert rewritten["enum"] == [3, 9, "s"]
    assert accepts(tok, analyze_schema(schema).schema, 9)
    assert not accepts(tok, analyze_schema(schema).schema, 2)


def test_one_of_of_untyped_objects_is_disjoint_within_the_node_type():
    """Branches that differ in a required discriminator are disjoint among objects even though
    they do not say `type: object` themselves (non-objects satisfy both)."""
    branches = [
        {"properties": {"kind": {"const": k}, "v": {"type": "string"}}, "required": ["kind"]}
        for k in ("a", "b", "c")
    ]
    schema = {"type": "object", "oneOf": [{"$ref": f"#/$defs/{k}"} for k in "abc"]}
    schema["$defs"] = dict(zip("abc", branches, strict=True))
    rewritten = assert_equivalent(schema)
    one_of = rewritten["allOf"][0]
    assert len(one_of["anyOf"]) == 3 and all("$ref" in b for b in one_of["anyOf"])


def test_one_of_rejects_types_two_branches_accept_wholesale():
    """Without a `type`, two object-only branches both accept every string: oneOf then admits
    no string at all, and among objects the discriminator makes the branches disjoint."""
    branches = [{"properties": {"kind": {"enum": [k]}}, "required": ["kind"]} for k in ("a", "b")]
    schema = {"oneOf": branches}
    rewritten = assert_equivalent(schema, POOL + [{"kind": "a"}, {"kind": "b"}, {"kind": "c"}])
    assert rewritten["allOf"][0]["type"] == ["object"]
    assert "pattern" not in json.dumps(rewritten)  # no negation was needed


def test_a_pattern_with_an_end_anchor_inside_compiles_as_a_narrowing(llama3_tokenizer):
    """`(,|$)` inside a pattern: the backend refuses an end anchor anywhere but at the end, so
    the pattern is written without it (`$` read as the end of the text, a narrowing) instead of
    being refused (MaskBench catalogue-entry, Github_hard---o60770); a `regex` constraint, which
    must be exact, is refused by Corral with the reason rather than by the backend."""
    from corral.grammar.schema.rewrite_log import PATTERN_LOOKAROUND

    item = {"type": "string", "pattern": "^([^,]+(,|$)){3,}$"}
    schema = {"type": "object", "properties": {"tags": item}, "required": ["tags"]}
    c = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    assert any(r.rewrite == PATTERN_LOOKAROUND for r in c.rewrites)
    bitmask = torch.zeros((1, llama3_tokenizer.mask_words), dtype=torch.int32)
    for text, valid in [("a,b,c", True), ("a,b,c,", True), ("a,b", False), ("a,,b,c", False)]:
        instance = {"tags": text}
        assert judge(schema).is_valid(instance) is valid, text
        ids = llama3_tokenizer.encode(json.dumps(instance, separators=(",", ":")))
        assert walk_accepts(c.matcher(), ids, bitmask) is valid, text
    with pytest.raises(ConstraintError, match="end anchor inside"):
        compile_constraint(ConstraintSpec.regex("a$b?"), llama3_tokenizer)


QUOTING = [
    ('^[^"]*$', ['a"b', "a\\b", "ab", "a\nb", "\t"]),
    ("^[^\\\\]+$", ['a"b', "a\\b", "ab", "\x1f"]),
    ('^[^"\\\\]*$', ['a"b', "a\\b", "ab"]),
    ("^(?:[\\x00-\\x0f]|[\\x10-\\x1f]|xy)+$", ['"', "\\", "\x01xy", "xy"]),
    ('^[^a"]+$', ['"', "\\", "b\\"]),
]


@pytest.mark.parametrize(("pattern", "texts"), QUOTING, ids=[p for p, _ in QUOTING])
def test_classes_of_every_control_character_never_let_a_quote_through(
    pattern, texts, llama3_tokenizer
):
    """llguidance lets `"` and `\\` through a class that holds every control character, inside
    a JSON string, even where the class leaves them out (`^[^"]*$` accepted `a"b`): such a
    class is handed to it without NUL, and the compiled grammar accepts exactly what the judge
    accepts (NUL aside); on keys, where that would not be exact, the pattern is refused."""
    from corral.grammar.schema.rewrite_log import PATTERN_NUL

    tok = llama3_tokenizer
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    schema = {"type": "string", "pattern": pattern}
    c = compile_constraint(ConstraintSpec.json_schema(schema), tok)
    assert any(r.rewrite == PATTERN_NUL for r in c.rewrites)
    for text in texts:
        ids = tok.encode(json.dumps(text))
        assert walk_accepts(c.matcher(), ids, bitmask) == judge(schema).is_valid(text), text
    assert not walk_accepts(c.matcher(), tok.encode(json.dumps("\x00")), bitmask)
    # keys: narrowed only where a key the backend's regex misses is refused anyway
    keys = {"type": "object", "patternProperties": {pattern: {}}, "additionalProperties": False}
    closed = compile_constraint(ConstraintSpec.json_schema(keys), tok)
    for text in [*texts, "\x00"]:
        ids = tok.encode(json.dumps({text: 1}, separators=(",", ":")))
        valid = judge(keys).is_valid({text: 1}) and "\x00" not in text
        assert walk_accepts(closed.matcher(), ids, bitmask) == valid, text
    with pytest.raises(ConstraintError, match="control character"):
        compile_constraint(ConstraintSpec.json_schema({**keys, "additionalProperties": {}}), tok)
    # the backend's own behaviour, which the guard works around: test_backend_quirks.py
    # (test_llguidance_1_9_1_control_class_lets_quotes_through)


QUOTED_STRINGS = ['"', "\\", 'a"', "b\\", 'a"b', "a\\b", "\x01", "\n", "x", "", '""', "\\\\"]
STRING_SCHEMAS = [
    {"not": {"const": '"'}},
    {"not": {"enum": ['a"', "b\\", "x"]}},
    {"not": {"pattern": '^a"'}},
    {"not": {"pattern": "\\\\"}},
    {"pattern": '^[^"\\\\]*$'},
    {"pattern": '^(?:[^"]|"")*$'},
    {"pattern": "^[^a]*$"},
    {"enum": ['a"b', "a\\b", "x"]},
    {"oneOf": [{"pattern": '"'}, {"pattern": "\\\\"}]},
    {"format": "regex"},
    {"format": "uri-template"},
]


@pytest.mark.parametrize("node", STRING_SCHEMAS, ids=[json.dumps(s) for s in STRING_SCHEMAS])
def test_quotes_and_backslashes_are_judged_like_the_judge(node, llama3_tokenizer):
    """Strings holding `"`, `\\` and control characters, through every rewrite that writes a
    string regex for the backend (negated `const`/`enum`, negated and plain patterns, `oneOf`,
    formats): the compiled grammar never accepts one the judge refuses (before: `not: {const:
    '"'}` accepted `"`, through the backend's quoting of a class of every control character)."""
    tok = llama3_tokenizer
    schema = {"type": "string", **node}
    c = compile_constraint(ConstraintSpec.json_schema(schema), tok)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    for text in QUOTED_STRINGS:
        accepted = walk_accepts(c.matcher(), tok.encode(json.dumps(text)), bitmask)
        assert not accepted or judge(schema).is_valid(text), (schema, text)
