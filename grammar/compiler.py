"""compile_constraint: ConstraintSpec + tokenizer -> CompiledConstraint, picking the backend.

Policy: llguidance compiles in about a millisecond and refuses what it cannot enforce, so every
constraint is compiled with it first and a request never waits for a slow compile. JSON schemas
first pass Corral's own analysis (fail closed, rewrite into forms llguidance enforces exactly).
xgrammar is used for EBNF grammars that llguidance's GBNF converter cannot read.
"""

from __future__ import annotations

from corral.grammar import backend_llguidance as llg
from corral.grammar import backend_xgrammar as xgr
from corral.grammar.compiled import CompiledConstraint
from corral.grammar.errors import ConstraintError
from corral.grammar.regex_translate import literal_regex, translate_regex
from corral.grammar.schema_analysis import analyze_schema
from corral.grammar.spec import ConstraintKind, ConstraintSpec
from corral.grammar.tokenizer import TokenizerInfo


def compile_constraint(spec: ConstraintSpec, tok: TokenizerInfo) -> CompiledConstraint:
    """Compile ``spec`` for ``tok``; raises :class:`ConstraintError` for a client's mistake."""
    if spec.kind is ConstraintKind.EBNF:
        return _compile_ebnf(spec, tok)
    unenforced: tuple = ()
    if spec.kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT):
        plan = analyze_schema(spec.schema(), lenient=not spec.strict, source=spec.source or None)
        grammar = llg.grammar_from_schema(plan.schema, spec.json_format)
        unenforced, keyword = plan.unenforced, "schema"
    elif spec.kind is ConstraintKind.REGEX:
        grammar, keyword = llg.grammar_from_regex(translate_regex(spec.source)), "regex"
    elif spec.kind is ConstraintKind.CHOICE:
        # One regex alternation: a lexer-level DFA, so thousands of choices stay cheap (a grammar
        # rule with as many alternatives would exceed the parser's row limit).
        pattern = "|".join(f"(?:{literal_regex(c)})" for c in spec.choices())
        grammar, keyword = llg.grammar_from_regex(pattern), "choice"
    elif spec.kind is ConstraintKind.LARK:
        grammar, keyword = llg.grammar_from_lark(spec.source), "lark"
    else:  # pragma: no cover - the enum is closed
        raise ConstraintError(f"unknown constraint kind {spec.kind}")
    return _llguidance(grammar, spec, tok, keyword, unenforced)


def _llguidance(
    grammar: str, spec: ConstraintSpec, tok: TokenizerInfo, keyword: str, unenforced: tuple = ()
) -> CompiledConstraint:
    prototype = llg.new_prototype(grammar, tok, keyword)
    return CompiledConstraint(
        backend=llg.NAME,
        payload=grammar.encode(),
        spec_digest=spec.digest,
        tokenizer_fingerprint=tok.fingerprint,
        eos_token_ids=frozenset(tok.eos_token_ids),
        unenforced=tuple(unenforced),
        native=prototype,
    )


def _compile_ebnf(spec: ConstraintSpec, tok: TokenizerInfo) -> CompiledConstraint:
    try:
        lark = llg.gbnf_to_lark(spec.source)
        return _llguidance(llg.grammar_from_lark(lark), spec, tok, "ebnf")
    except ConstraintError as llg_error:
        try:
            compiled = xgr.compile_ebnf(spec.source, tok)
        except Exception as e:  # xgrammar raises RuntimeError/ValueError with its parse message
            raise ConstraintError(
                f"the EBNF grammar was refused: {llg_error.reason}; xgrammar: {_first_line(e)}",
                keyword="ebnf",
            ) from e
    return CompiledConstraint(
        backend=xgr.NAME,
        payload=xgr.serialize(compiled),
        spec_digest=spec.digest,
        tokenizer_fingerprint=tok.fingerprint,
        eos_token_ids=frozenset(tok.eos_token_ids),
        native=compiled,
    )


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
