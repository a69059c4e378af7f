"""GBNF and Lark grammars: every corpus grammar compiles or is refused with an error naming
the construct; random walks through the ones that compile are checked by an independent
judge -- Python's ``lark`` parser for Lark grammars, xgrammar (or ``json.loads`` for the
JSON grammars xgrammar cannot read) for GBNF ones."""

from __future__ import annotations

import json
import random
import re

import lark
import pytest
import torch
from grammar_walkers import TokenTable, check_forced, decode, steered_walk

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.backends import xgr as xgr
from corral.grammar.core.walk import accepts

WALKS = 4
CLOSERS = b';)}]"\n='

# Grammars the backend refuses today, with the construct the error must name. The list may
# only shrink: a grammar that compiles must keep compiling.
REFUSED = {
    "go_grammar.lark": "priority",
    "prover9_grammar.lark": "priority",
    "python_grammar.lark": "priority",
    "sql_grammar.lark": "priority",
    "outlines-common.lark": "start",  # a library of terminals with no start rule
}
# GBNF files whose language is JSON (xgrammar cannot parse their layout; json.loads judges).
JSON_GBNF = {"json.gbnf", "json_arr.gbnf"}


def _grammar_files(corpus) -> list:
    root = corpus("grammars")
    return sorted(p for p in root.glob("*/*") if p.suffix in (".gbnf", ".lark"))


def _spec(path) -> ConstraintSpec:
    text = path.read_text()
    return ConstraintSpec.ebnf(text) if path.suffix == ".gbnf" else ConstraintSpec.lark(text)


@pytest.fixture(scope="module")
def grammars(corpus, llama3_tokenizer):
    """name -> (path, compiled constraint or the ConstraintError)."""
    out = {}
    for path in _grammar_files(corpus):
        try:
            out[path.name] = (path, compile_constraint(_spec(path), llama3_tokenizer))
        except ConstraintError as e:
            out[path.name] = (path, e)
    return out


def test_corpus_grammars_compile_or_name_the_construct(grammars):
    assert len(grammars) >= 20
    refused = {n: r for n, (_, r) in grammars.items() if isinstance(r, ConstraintError)}
    unexpected = set(refused) - set(REFUSED)
    assert not unexpected, {n: refused[n].reason for n in unexpected}
    for name, err in refused.items():
        path = grammars[name][0]
        assert err.keyword == ("ebnf" if path.suffix == ".gbnf" else "lark")
        assert REFUSED[name] in err.reason, f"{name}: {err.reason}"
        where = re.match(r"at (\d+)\((\d+)\)", err.reason)
        if REFUSED[name] == "priority":
            # The error points at the line that declares a priority (`rule.N:` / `TERM.N:`).
            assert where, err.reason
            line = path.read_text().splitlines()[int(where.group(1)) - 1]
            assert re.match(r"\s*\??[\w]+\.-?\d+\s*:", line), (name, line)


def _lark_judge(path):
    return lark.Lark(path.read_text(), start="start", parser="earley", lexer="dynamic")


def _walks(compiled, tok, seed: str):
    table = TokenTable.cached(tok, closers=CLOSERS)
    rng = random.Random(seed)
    for _ in range(WALKS):
        w = steered_walk(compiled.matcher(), table, rng, max_tokens=150, end_bias=0.8, steer=0.6)
        check_forced(w, tok)
        yield w


def _compiled(grammars, name):
    path, compiled = grammars[name]
    if isinstance(compiled, ConstraintError):
        pytest.skip(f"{name} is refused: {compiled.reason}")
    return path, compiled


LARK_FILES = [
    "c_grammar.lark",
    "calc_grammar.lark",
    "invariants.lark",
    "java_grammar.lark",
    "json_grammar.lark",
    "outlines-arithmetic.lark",
    "outlines-json.lark",
    "tiny_grammar.lark",
]
GBNF_FILES = [
    "arithmetic.gbnf",
    "c.gbnf",
    "chess.gbnf",
    "english.gbnf",
    "japanese.gbnf",
    "json.gbnf",
    "json_arr.gbnf",
    "list.gbnf",
    "vllm-sql.gbnf",
]


@pytest.mark.parametrize("name", LARK_FILES)
def test_lark_walks_parse_with_lark(name, grammars, llama3_tokenizer):
    path, compiled = _compiled(grammars, name)
    judge = _lark_judge(path)
    done = 0
    for w in _walks(compiled, llama3_tokenizer, name):
        if w.terminated:
            done += 1
            text = decode(llama3_tokenizer, w.tokens)
            try:
                judge.parse(text)
            except lark.exceptions.LarkError as e:
                raise AssertionError(f"lark refuses the walk {text[:200]!r}: {e}") from e
    assert done, "no walk terminated"


@pytest.mark.parametrize("name", GBNF_FILES)
def test_gbnf_walks_are_accepted_by_an_independent_judge(name, grammars, llama3_tokenizer):
    """Every prefix llguidance allows is one xgrammar allows; a finished walk is complete for
    xgrammar too (or, for the JSON grammars, valid JSON)."""
    path, compiled = _compiled(grammars, name)
    assert compiled.backend == "llguidance"
    judge = None if name in JSON_GBNF else xgr.compile_ebnf(path.read_text(), llama3_tokenizer)
    for w in _walks(compiled, llama3_tokenizer, name):
        text = decode(llama3_tokenizer, w.tokens)
        if judge is None:
            if w.terminated:
                json.loads(text)
            continue
        m = xgr.XGrammarMatcher(judge)
        assert m.accept_tokens(w.tokens) == len(w.tokens), f"xgrammar refuses {text[:200]!r}"
        assert m.can_terminate() or not w.terminated, f"xgrammar: {text[:200]!r} is unfinished"


def test_lark_common_escaped_string_means_what_lark_says(llama3_tokenizer):
    """``%import common.ESCAPED_STRING`` is Lark's `"` .*? `"` with no newline inside (``.``
    does not match ``\\n``); the constraint must not admit a raw newline Lark rejects."""
    grammar = "start: ESCAPED_STRING\n%import common.ESCAPED_STRING\n"
    c = compile_constraint(ConstraintSpec.lark(grammar), llama3_tokenizer)
    judge = lark.Lark(grammar, parser="earley", lexer="dynamic")
    bitmask = torch.zeros((1, llama3_tokenizer.mask_words), dtype=torch.int32)
    for text in ['"a\\"b"', '"a\tb"', '"a\nb"', '"ab\\"']:
        try:
            judge.parse(text)
            lark_ok = True
        except lark.exceptions.LarkError:
            lark_ok = False
        ours = accepts(c.matcher(), llama3_tokenizer.encode(text), bitmask)
        assert ours == lark_ok, f"{text!r}: constraint {ours}, lark {lark_ok}"


def test_ebnf_refused_by_both_backends_names_both_reasons(llama3_tokenizer):
    with pytest.raises(ConstraintError) as info:
        compile_constraint(ConstraintSpec.ebnf('root ::= "a" (= "b") "b"'), llama3_tokenizer)
    assert info.value.keyword == "ebnf"
    assert "xgrammar" in info.value.reason and "line 1" in info.value.reason


COMMON_TERMINALS = [
    "ESCAPED_STRING",
    "SIGNED_NUMBER",
    "DECIMAL",
    "FLOAT",
    "CNAME",
    "WORD",
    "WS",
    "NEWLINE",
    "HEXDIGIT",
    "SH_COMMENT",
    "CPP_COMMENT",
]


@pytest.mark.parametrize("terminal", COMMON_TERMINALS)
def test_walks_through_lark_common_terminals_parse_with_lark(terminal, llama3_tokenizer):
    """The backend brings its own ``%import common.*``; walks must still be what Lark accepts."""
    grammar = f"start: {terminal}\n%import common.{terminal}\n"
    c = compile_constraint(ConstraintSpec.lark(grammar), llama3_tokenizer)
    judge = lark.Lark(grammar, parser="earley", lexer="dynamic")
    table = TokenTable.cached(llama3_tokenizer, closers=b'"\n ')
    rng = random.Random(terminal)
    done = 0
    for _ in range(12):
        w = steered_walk(c.matcher(), table, rng, max_tokens=40, end_bias=0.5, steer=0.5)
        if w.terminated:
            done += 1
            judge.parse(decode(llama3_tokenizer, w.tokens))
    assert done
