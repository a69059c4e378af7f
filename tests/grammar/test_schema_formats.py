"""Format patterns: every string they allow must pass `jsonschema`'s format checker."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from corral.grammar.schema.formats import CHECKED_FORMATS, EXACT_FORMATS, format_constraint

CHECKER = Draft202012Validator.FORMAT_CHECKER


@pytest.mark.parametrize("name", sorted(EXACT_FORMATS))
def test_format_pattern_is_a_subset_of_the_checker(name):
    pattern, max_len = EXACT_FORMATS[name]
    assert name in CHECKED_FORMATS

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_regex(re.compile(pattern), fullmatch=True))
    def check(s):
        if s.endswith("\n"):  # Python's `$` allows one; the backend's regex does not
            return
        if max_len is not None and len(s) > max_len:
            return
        assert CHECKER.conforms(s, name), (name, s)

    check()


@pytest.mark.parametrize(
    "name,good,bad",
    [
        ("date", ["2024-02-29", "2023-12-31"], ["2023-02-29", "2023-13-01", "0000-01-01"]),
        (
            "date-time",
            ["2023-01-01T00:00:00Z", "2023-01-01t10:00:00.5+01:00"],
            ["2023-01-01T23:59:60Z"],
        ),
        ("time", ["23:59:59Z"], ["23:59:60Z", "24:00:00Z"]),
        ("ipv4", ["1.2.3.4"], ["01.2.3.4", "256.1.1.1"]),
        ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
        ("hostname", ["a.example", "x" * 63], ["-a", "a" * 64, ".".join(["a" * 60] * 5)]),
        ("uri", ["http://a.b/c?d#e", "urn:x"], ["//no-scheme", "a b"]),
        (
            "iri",
            ["https://example.com", "http://é.com/ü?q=ö#f", "x:", "http://[1:2:3:4:5:6::7]/"],
            ["//no-scheme", "a b", "http://a/%zz", "http://[::1]/", "http://[1::2:3:4:5:6]/"],
        ),
        ("iri-reference", ["//x", "/a", "", "?q", "a:b", "%41"], ["a b", "%4"]),
        ("uri-template", ["{a}", "x{+a,b:3}y", "{#a*}", "{a.b}", "p q"], ["{}", "{a:0}", "a}"]),
        (
            "regex",
            ["^/api/(.*)$", "", "(a|b)*?", "[^a-z\\]]{2,3}", "\\d+\\.\\d*", "((a)?)|x"],
            ["a**", "*a", "[z-a]", "[^]", "\\1", "a{3,2}", "(a", "\\q", "^*"],
        ),
    ],
)
def test_format_examples(name, good, bad):
    pattern, max_len = EXACT_FORMATS[name]
    for s in good:
        assert re.fullmatch(pattern.strip("^$"), s) and CHECKER.conforms(s, name), s
    for s in bad:
        ok = re.fullmatch(pattern.strip("^$"), s) and (max_len is None or len(s) <= max_len)
        assert not ok, s


def test_unchecked_format_is_an_annotation_and_unenforceable_is_none():
    assert format_constraint("int64") == {}
    assert format_constraint("idn-hostname") is None
    assert "pattern" in format_constraint("date")


def test_regex_format_subset_compiles_even_against_hostile_pieces():
    """Strings of regex pieces (quantifiers, brackets, escapes, counts) the subset lets through
    all compile with Python's `re`, warnings included: the subset never admits an invalid
    regex, however the pieces are put together."""
    import random
    import warnings

    pattern, _ = EXACT_FORMATS["regex"]
    subset = re.compile(pattern[1:-1])
    pieces = "a b 0 z - ^ $ . | ? * + ( ) (?: [ ] [^ { } {2} {1,3} {3,1} {,2} , \\ \\d \\b \\1"
    pieces = pieces.split() + ["\\-", "\\]", "a-z", "z-a", "&", "~", "??", "*?", "\\A", "é"]
    rng, admitted = random.Random(3), 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(40_000):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 7)))
            if subset.fullmatch(text):
                admitted += 1
                re.compile(text)
    assert admitted > 5_000
