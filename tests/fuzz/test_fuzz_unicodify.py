"""`--unicode`: drawn Unicode strings put into a corpus schema's text, and drawn Unicode
schemas; the server-side run is in test_fuzz_url.py."""

from __future__ import annotations

import itertools

from corral.fuzz.case import Case
from corral.fuzz.judge import Judge
from corral.fuzz.unicodify import iter_unicode_schemas, unicode_case

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green"]},
        "code": {"type": "string", "pattern": "^[a-z]+$"},
        "kind": {"const": "fixed"},
    },
    "required": ["color", "code", "kind"],
}


def _non_ascii(text: str) -> bool:
    return any(ord(c) > 127 for c in text)


def test_every_text_slot_gets_a_drawn_string_and_the_case_is_new():
    case = Case.from_schema("c", SCHEMA, [({"color": "red"}, False)], "src", seed=11)
    u = unicode_case(case)
    assert u.id == "c+unicode" and u.tests == [] and u.seed == 11
    assert u == unicode_case(case)  # the same draw for the same case
    props = u.schema["properties"]
    renamed = [k for k in props if k not in SCHEMA["properties"]]
    assert len(renamed) == 1 and _non_ascii(renamed[0])
    assert set(u.schema["required"]) == set(props)  # `required` follows the renamed key
    color = next(v for v in props.values() if "enum" in v)
    assert color["enum"][:2] == ["red", "green"] and len(color["enum"]) == 3
    kind = next(v for v in props.values() if "const" in v)
    assert kind["const"] != "fixed"
    code = next(v for v in props.values() if "pattern" in v)
    assert code["pattern"].startswith("^") and code["pattern"] != "^[a-z]+$"
    assert u.prompt.startswith("A note from the user: ")
    assert SCHEMA["properties"]["kind"] == {"const": "fixed"}  # the corpus schema is untouched


def test_a_replaced_pattern_matches_exactly_its_drawn_string():
    for seed in range(20):
        u = unicode_case(Case.from_schema("p", {"type": "string", "pattern": "x"}, seed=seed))
        judge, pattern = Judge(u.schema), u.schema["pattern"]
        # the literal's escapes undone give the drawn string; the judge accepts exactly it
        drawn = _unescape(pattern[1:-1])
        assert judge.is_valid(drawn), (pattern, drawn)
        assert not judge.is_valid(drawn + "x")


def test_drawn_unicode_schemas_have_unicode_keys_and_differ():
    cases = list(itertools.islice(iter_unicode_schemas(seed=5), 30))
    assert len({c.schema_json for c in cases}) > 20
    assert sum(_non_ascii("".join(c.schema["properties"])) for c in cases) > 20
    assert all(c.schema["required"][0] in c.prompt for c in cases)


def _unescape(literal: str) -> str:
    out, chars = [], iter(literal)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars)
        if nxt == "u":
            out.append(chr(int("".join(next(chars) for _ in range(4)), 16)))
        else:
            out.append(nxt)
    return "".join(out)
