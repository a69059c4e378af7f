"""Regex constraints: every corpus regex compiles or is refused with a reason; random walks
match the regex (``re.fullmatch``, Python's own semantics); instances Python accepts are
accepted token by token (ASCII instances where positive shorthands are narrowed to ASCII)."""

from __future__ import annotations

import json
import random
import re
import warnings
from functools import cache

import pytest
import torch
from grammar_walkers import TokenTable, check_forced, decode, steered_walk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.core.walk import accepts, random_walk

WALKS_PER_REGEX = 3
SAMPLE = 150
ASCII = st.characters(codec="ascii")

# (pattern, alphabet for instances): None lets hypothesis use any character.
HAND_PICKED = [
    (r"\d{3}-\d{2,4}", ASCII),
    (r"\D{1,4}", None),
    (r"\w+@\w+\.com", ASCII),
    (r"\W{1,3}", None),
    (r"\s*x\s*", ASCII),
    (r"\S{2,5}", None),
    (r"a.c", None),
    (r"[^a-z]{2,4}", None),
    (r"[^\d\s]+", None),
    (r"[\D]{2}", None),
    (r"(ab|cd){2,3}", None),
    (r"x{0,3}y+?", None),
    (r"[α-ω]+", None),
    (r"é|ü|ñ+", None),
    (r"[一-鿿]{1,3}", None),
    (r"\d*\.\d+", ASCII),
    (r"(?:[A-Z][a-z]*\s?){1,3}", ASCII),
    (r"[\w-]+", ASCII),
    (r"[^\W\d]+", None),
    (r"\$\d+(\.\d\d)?", ASCII),
    (r"[.]+|\\[nt]", None),
    (r"(a|b)*c", None),
    (r"[\u0000-\u001f]{1,2}", None),
    (r"^[A-Fa-f\d]{8}$", ASCII),
    (r"\[\]\{\}\(\)\*\+\?\|\^", None),
    (r"😀+|[🙀-🙏]", None),
]

# Refused constructs and a word the reason must contain.
REFUSED = {
    r"(?=a)a": "look-ahead",
    r"(?<!a)b": "look-",
    r"(a)\1": "back-reference",
    r"(?i)abc": "flags",
    r"a(?i:b)": "flag",
    r"a\b": "word-boundary",
    r"\Ba": "word-boundary",
    r"a++": "possessive",
    r"(?>a)b": "atomic",
    r"(a)?(?(1)b|c)": "conditional",
    r"[": "invalid",
    r"a{2,1}": "invalid",
    r"[^\x00-\U0010ffff]": "matches nothing",
}


@pytest.fixture(scope="module")
def tok(llama3_tokenizer):
    return llama3_tokenizer


def _table(pattern: str, tok) -> TokenTable:
    """Steer walks towards tokens holding the pattern's punctuation (``@`` ``.`` ``-`` ...),
    so that patterns like ``\\w+@\\w+`` get past their first run of letters."""
    punct = {c for c in pattern.encode() if c < 128 and not chr(c).isalnum()}
    return TokenTable.cached(tok, closers=bytes(sorted(punct - set(b"\\()[]{}*+?|^$"))))


@cache
def _corpus_patterns(path) -> list[str]:
    with open(path / "jsonschema-patterns.jsonl") as f:
        return [json.loads(line)["pattern"] for line in f]


def _compile(pattern: str, tok):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "possible nested set" in some patterns
        return compile_constraint(ConstraintSpec.regex(pattern), tok)


def _python_accepts(pattern: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            re.compile(pattern)
        except re.error:
            return False
    return True


def test_every_corpus_regex_compiles_or_is_refused_with_a_reason(tok, corpus):
    patterns = _corpus_patterns(corpus("regex"))
    assert len(patterns) > 1000
    refused = []
    for p in patterns:
        try:
            _compile(p, tok)
        except ConstraintError as e:
            assert e.reason and e.keyword == "regex", (p, e.reason, e.keyword)
            refused.append((p, e.reason))
    print(f"{len(patterns) - len(refused)} of {len(patterns)} corpus regexes compile")
    # Refusing is the exception: constructs a token automaton cannot follow, or bad syntax.
    assert len(refused) < 0.03 * len(patterns), refused[:5]
    for p, reason in refused:
        named = any(
            w in reason
            for w in (
                "look-",
                "lookaround",
                "back-reference",
                "invalid",
                "non-empty",
                "flags",
                "anchor",
            )
        )
        assert named, f"the refusal of {p!r} does not name the construct: {reason}"
        if "invalid regular expression" in reason:
            assert not _python_accepts(p), f"{p!r} is valid for Python but refused as invalid"


def _walk_and_match(pattern: str, tok, rng, walks: int) -> tuple[int, int]:
    c = _compile(pattern, tok)
    table = _table(pattern, tok)
    done = 0
    for _ in range(walks):
        w = steered_walk(c.matcher(), table, rng, max_tokens=200, end_bias=0.5, steer=0.5)
        if not w.terminated:
            continue
        done += 1
        text = decode(tok, w.tokens)
        assert re.fullmatch(pattern, text), f"{pattern!r} does not match the walk {text!r}"
        check_forced(w, tok)
    return done, walks


def test_walks_over_a_corpus_sample_match(tok, corpus):
    patterns = _corpus_patterns(corpus("regex"))
    sample = random.Random(7).sample(patterns, SAMPLE)
    done = total = 0
    for p in sample:
        try:
            _compile(p, tok)
        except ConstraintError:
            continue
        d, n = _walk_and_match(p, tok, random.Random(p), WALKS_PER_REGEX)
        done, total = done + d, total + n
    print(f"corpus regex walks: {done} of {total} terminated within 200 tokens")
    assert done >= 0.8 * total


@pytest.mark.parametrize("pattern", [p for p, _ in HAND_PICKED])
def test_walks_over_hand_picked_regexes_match(pattern, tok):
    done, total = _walk_and_match(pattern, tok, random.Random(pattern), 6)
    assert done >= total // 2, f"only {done} of {total} walks terminated"


def test_plain_random_walk_matches(tok):
    """The shared uniform walk of corral.grammar.core.walk agrees (a few short walks: it is slow)."""
    rng = random.Random(1)
    for pattern in (r"[a-z]{1,4}\d", r"(yes|no|maybe)"):
        c = _compile(pattern, tok)
        for _ in range(2):
            ids = random_walk(c.matcher(), tok.vocab_size, tok.eos_token_ids, rng, max_tokens=20)
            assert ids is not None and re.fullmatch(pattern, decode(tok, ids))


@pytest.mark.parametrize("pattern, alphabet", HAND_PICKED, ids=[p for p, _ in HAND_PICKED])
@settings(
    max_examples=8,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_instances_python_accepts_are_accepted(pattern, alphabet, tok, data):
    text = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=alphabet))
    c = _compile(pattern, tok)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    assert accepts(c.matcher(), tok.encode(text), bitmask), f"{text!r} refused"


@pytest.mark.parametrize("pattern", REFUSED)
def test_refused_constructs_are_named(pattern, tok):
    with pytest.raises(ConstraintError) as info:
        _compile(pattern, tok)
    assert info.value.keyword == "regex"
    assert REFUSED[pattern] in info.value.reason, info.value.reason


def test_python_and_backend_agree_on_newlines(tok):
    """``.`` skips only ``\\n`` (no DOTALL); ``$`` at the end does not admit a trailing newline
    under fullmatch."""
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    for pattern, text in [("a.c", "a\rc"), ("a.c", "a\nc"), ("ab$", "ab\n"), ("[^x]", "\n")]:
        c = _compile(pattern, tok)
        expected = re.fullmatch(pattern, text) is not None
        assert accepts(c.matcher(), tok.encode(text), bitmask) == expected, (pattern, text)
