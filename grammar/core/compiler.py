"""compile_constraint: ConstraintSpec + tokenizer -> CompiledConstraint, picking the backend.

Policy: llguidance compiles in about a millisecond and refuses what it cannot enforce, so every
constraint is compiled with it first and a request never waits for a slow compile. JSON schemas
first pass Corral's own analysis (fail closed, rewrite into forms llguidance enforces exactly).
xgrammar is used for EBNF grammars that llguidance's GBNF converter cannot read.

Every llguidance prototype is probed before it is returned (``probe``): a constraint whose
matcher would fail at its first positions (llguidance's runtime limits, or no valid output) is
never handed out. Where the limit that failed is one Corral may raise (``llg_limits.RAISED``),
the prototype is rebuilt with it raised and probed again; otherwise, or if it fails again, the
constraint is refused with ``ConstraintError(limit=...)`` naming the limit.

Copies: a JSON-schema spec holds only canonical text; `compile_constraint` analyses a fresh parse
(`spec.schema()` parses a new copy per call), so no caller's object is reachable from a compile.
"""

from __future__ import annotations

from types import MappingProxyType

from corral.grammar.backends import llg as llg
from corral.grammar.backends import xgr as xgr
from corral.grammar.backends.llg_limits import RAISED, effective_limits, needed
from corral.grammar.backends.llg_probe import ProbeFailure, probe
from corral.grammar.checks.value_sites import (
    SiteConflict,
    has_marks,
    marks,
    strip_marks,
    value_sites,
)
from corral.grammar.core.compiled import CompiledConstraint
from corral.grammar.core.errors import ConstraintError, Unenforced
from corral.grammar.core.input_checks import nesting_error
from corral.grammar.core.reasoning import after_reasoning
from corral.grammar.core.spec import ConstraintKind, ConstraintSpec
from corral.grammar.core.structural_tag import structural_tag_lark
from corral.grammar.core.tokenizer import TokenizerInfo
from corral.grammar.regex.algebra import RegexAlgebra
from corral.grammar.regex.translate import literal_regex, translate_regex
from corral.grammar.schema.analysis import SchemaPlan, analyze_schema
from corral.grammar.schema.order import backend_layout
from corral.grammar.schema.rewrite_log import ANY_ORDER, VALUE_CHECKS, Rewritten


def regex_algebra(tok: TokenizerInfo) -> RegexAlgebra:
    """The regex memos the compiles for ``tok`` share (``TokenizerInfo.derived`` keeps one per
    tokenizer: the long-lived object every compile has). Regexes do not depend on the
    tokenizer; the tokenizer is only their owner, so a server's compiles reuse each other's
    automata and translations, bounded by ``RegexAlgebra``'s LRU sizes."""
    return RegexAlgebra()


def compile_constraint(spec: ConstraintSpec, tok: TokenizerInfo) -> CompiledConstraint:
    """Compile ``spec`` for ``tok``; raises :class:`ConstraintError` for a client's mistake."""
    try:
        return _compile(spec, tok)
    except RecursionError:  # a spec built directly, past the constructors' depth check
        is_json = spec.kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT)
        raise nesting_error("schema" if is_json else f"{spec.kind} constraint") from None


def _compile(spec: ConstraintSpec, tok: TokenizerInfo) -> CompiledConstraint:
    if spec.kind is ConstraintKind.EBNF:
        return _compile_ebnf(spec, tok)
    unenforced: tuple = ()
    rewrites: tuple[Rewritten, ...] = ()
    raised: dict[str, int] = {}
    distinct_keys = False
    if spec.kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT):
        algebra = tok.derived(regex_algebra)  # the tokenizer's regex memos, shared by compiles
        plan = analyze_schema(
            spec.schema(),
            lenient=not spec.strict,
            source=spec.source or None,
            check_keys=spec.reasoning is None,
            algebra=algebra,
        )
        schema, distinct_keys, rewrites = plan.schema, plan.distinct_keys, plan.rewrites
        if spec.reasoning is None:
            sources = dict(plan.regex_sources)
            schema, distinct_keys, freed = backend_layout(schema, distinct_keys, sources, algebra)
            rewrites += _any_order(plan, freed)
        json_alone = spec.reasoning is None
        lost = checked_marks(schema, spec.strict, json_alone)
        if lost:  # lenient: the marks were dropped, so nothing is checked for them
            rewrites = tuple(r for r in rewrites if r.rewrite not in VALUE_CHECKS)
        unenforced = plan.unenforced + lost
        grammar = llg.grammar_from_schema(schema, spec.json_format)
        keyword = "schema"
    elif spec.kind is ConstraintKind.REGEX:
        grammar, keyword = llg.grammar_from_regex(translate_regex(spec.source)), "regex"
    elif spec.kind is ConstraintKind.CHOICE:
        # One regex alternation: a lexer-level DFA, so thousands of choices stay cheap (a grammar
        # rule with as many alternatives would exceed the parser's row limit).
        pattern = "|".join(f"(?:{literal_regex(c)})" for c in spec.choices())
        grammar, keyword = llg.grammar_from_regex(pattern), "choice"
    elif spec.kind is ConstraintKind.LARK:
        grammar, keyword = llg.grammar_from_lark(spec.source), "lark"
    elif spec.kind is ConstraintKind.STRUCTURAL_TAG:
        grammar, unenforced, raised, rewrites = _structural_tag(spec, tok)
        keyword = "structural_tag"
    else:  # pragma: no cover - the enum is closed
        raise ConstraintError(f"unknown constraint kind {spec.kind}")
    if spec.reasoning is not None:
        grammar = after_reasoning(grammar, *spec.reasoning, _special_token(tok))
    return _llguidance(grammar, spec, tok, keyword, unenforced, raised, distinct_keys, rewrites)


def _any_order(plan: SchemaPlan, freed: list[dict]) -> tuple[Rewritten, ...]:
    """One record per object whose optional properties ``backend_layout`` freed; an object the
    analysis built itself (a negation, a dependency) has no input pointer: the root stands in."""
    pointers = [plan.pointer_of(node) for node in freed]
    return tuple(
        Rewritten("" if p is None else f"{p}/properties", "properties", ANY_ORDER)
        for p in dict.fromkeys(pointers)
    )


def _structural_tag(spec: ConstraintSpec, tok: TokenizerInfo) -> tuple[str, tuple, dict, tuple]:
    """The structural tag's grammar, what lenient mode left out, the raised limits and the
    keyword rewrites (pointers into the tag's source, as lenient mode's).

    Each structure's schema is analysed (fail closed) and its own grammar probed first: the
    probe of the whole grammar walks the free text, so a schema past a backend limit must be
    refused here, not once the model writes a trigger. A limit a structure needed raised is
    raised for the whole grammar too, where that structure runs."""
    raised: dict[str, int] = {}
    rewrites: list[tuple[Rewritten, ...]] = []  # one entry per structure: analysed in order

    def analyse(schema):
        plan = analyze_schema(schema, lenient=not spec.strict, check_keys=False)
        rewrites.append(plan.rewrites)
        lost = checked_marks(plan.schema, spec.strict, json_alone=False)
        grammar = llg.grammar_from_schema(plan.schema, spec.json_format)
        raised.update(probed_prototype(grammar, tok, "schema", raised).raised)
        return plan.schema, plan.unenforced + lost

    lark, unenforced = structural_tag_lark(
        spec.structural_tag(), llg.json_options(spec.json_format), _special_token(tok), analyse
    )
    moved = tuple(
        r._replace(pointer=f"/structures/{i}/schema{r.pointer}")
        for i, found in enumerate(rewrites)
        for r in found
    )
    return llg.grammar_from_lark(lark), unenforced, raised, moved


def checked_marks(schema: object, strict: bool, json_alone: bool) -> tuple[Unenforced, ...]:
    """Make sure the matcher can check every value the analysis marked for it (``value_sites``:
    a number that must not be an integer, items that must not repeat): refuse the keyword that
    needed a mark where it cannot (strict), or drop the marks and report them (lenient;
    ``schema`` is changed in place)."""
    if not has_marks(schema):
        return ()
    try:
        if not json_alone:
            raise SiteConflict("", "the output is not JSON alone (reasoning or tags)")
        value_sites(schema)
        return ()
    except SiteConflict as e:
        why = f"cannot be checked at value boundaries here: {e.reason}"
        if strict:
            pointer = e.pointer or marks(schema)[0]
            raise ConstraintError(
                f"'{_keyword_at(pointer)}' {why}", pointer, _keyword_at(pointer)
            ) from None
        return tuple(
            Unenforced(p, _keyword_at(p), f"'{_keyword_at(p)}' {why}") for p in strip_marks(schema)
        )


def _keyword_at(pointer: str) -> str:
    return pointer.rsplit("/", 1)[-1] if pointer else "not"


def _special_token(tok: TokenizerInfo):
    """``text`` -> the id of the one special token that is exactly ``text``, else None."""

    def find(text: str) -> int | None:
        ids = tok.encode(text)
        if len(ids) == 1 and tok.llguidance.is_special_token(ids[0]):
            return ids[0]
        return None

    return find


def _llguidance(
    grammar: str,
    spec: ConstraintSpec,
    tok: TokenizerInfo,
    keyword: str,
    unenforced: tuple = (),
    raised: dict[str, int] | None = None,
    distinct_keys: bool = False,
    rewrites: tuple[Rewritten, ...] = (),
) -> CompiledConstraint:
    prototype = probed_prototype(grammar, tok, keyword, raised)
    return CompiledConstraint(
        backend=llg.NAME,
        payload=grammar.encode(),
        spec_digest=spec.digest,
        tokenizer_fingerprint=tok.fingerprint,
        eos_token_ids=frozenset(tok.eos_token_ids),
        unenforced=tuple(unenforced),
        native=prototype,
        limits=MappingProxyType(dict(prototype.raised)),
        distinct_keys=distinct_keys,
        rewrites=rewrites,
    )


def probed_prototype(
    grammar: str, tok: TokenizerInfo, keyword: str, raised: dict[str, int] | None = None
) -> llg.Prototype:
    """An llguidance prototype whose first positions the probe walked without an error
    (built with ``raised`` limits from the start, when given)."""
    raised = dict(raised or {})
    while True:
        prototype = llg.new_prototype(grammar, tok, keyword, raised)
        failure = probe(prototype.copy()[0], tok)
        if failure is None:
            return prototype
        more = _raise(failure, raised)
        if more is None:
            raise _probe_refusal(failure, keyword)
        raised = more


def _raise(failure: ProbeFailure, raised: dict[str, int]) -> dict[str, int] | None:
    """``raised`` with the failed limit raised, or None when that cannot help: not a limit Corral
    raises, raised already, pinned lower by ``CORRAL_LLG_LIMITS``, or the point that failed
    needs more than the raise (then a second build would only fail there again)."""
    limit = failure.limit
    if limit not in RAISED or raised.get(limit) == RAISED[limit]:
        return None
    if (needed(limit, failure.message) or 0) > RAISED[limit]:
        return None
    more = {**raised, limit: RAISED[limit]}
    if effective_limits(more)[limit] <= effective_limits(raised)[limit]:
        return None
    return more


def _probe_refusal(failure: ProbeFailure, keyword: str) -> ConstraintError:
    if failure.limit is not None:
        return ConstraintError(
            f"{failure.advice} (llguidance, within the first tokens of the output: "
            f"{failure.message})",
            keyword=keyword,
            limit=failure.limit,
        )
    where = "at its start" if failure.on_forced_path else "along a short valid start"
    return ConstraintError(
        f"no output can satisfy this constraint {where}: the grammar cannot continue "
        f"(llguidance: {failure.message}); a $ref cycle with no way out, or keywords that "
        "contradict each other, leave nothing to generate",
        keyword=keyword,
    )


def _compile_ebnf(spec: ConstraintSpec, tok: TokenizerInfo) -> CompiledConstraint:
    try:
        grammar = llg.grammar_from_lark(llg.gbnf_to_lark(spec.source))
        if spec.reasoning is not None:
            grammar = after_reasoning(grammar, *spec.reasoning, _special_token(tok))
        return _llguidance(grammar, spec, tok, "ebnf")
    except ConstraintError as llg_error:
        if llg_error.limit is not None:
            raise  # llguidance read it but it is too large to serve; xgrammar is no way round
        if spec.reasoning is not None:  # xgrammar gets no reasoning block: refuse, never drop
            raise
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
