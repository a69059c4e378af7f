"""The llguidance backend: near-instant compiles, refuses what it cannot enforce."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import llguidance
import torch

from corral.grammar.errors import ConstraintError
from corral.grammar.matcher import Matcher
from corral.grammar.spec import JsonFormat
from corral.grammar.tokenizer import TokenizerInfo

NAME = "llguidance"
VERSION = llguidance.__version__

# llguidance bounds its own work (lexer fuel, Earley items per step, grammar size), so a compile
# or a mask step cannot run away; these are its defaults made explicit.
LIMITS = dict(
    max_items_in_row=2000,
    initial_lexer_fuel=1_000_000,
    step_lexer_fuel=200_000,
    step_max_items=50_000,
    max_lexer_states=250_000,
    max_grammar_size=500_000,
)


def json_options(fmt: JsonFormat) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "item_separator": fmt.item_separator,
        "key_separator": fmt.key_separator,
        "whitespace_flexible": fmt.flexible,
    }
    if fmt.flexible:
        opts["whitespace_pattern"] = rf"[\x20\x0A\x0D\x09]{{0,{fmt.max_whitespace}}}"
    return opts


def grammar_from_schema(schema: dict[str, Any] | bool, fmt: JsonFormat) -> str:
    """The llguidance grammar text of a JSON schema; options override any x-guidance key."""
    if schema is False:
        raise ConstraintError("the schema is `false`: no value is valid", keyword="false")
    if schema is True:
        schema = {}
    return llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), overrides=json_options(fmt)
    )


# llguidance's built-in common.ESCAPED_STRING lets a raw newline into the string; Lark's own
# definition (the one a Lark grammar's author means) does not.
_LARK_ESCAPED_STRING = 'ESCAPED_STRING: /"(\\\\[^\\n]|[^"\\\\\\n])*"/'


def grammar_from_lark(lark: str) -> str:
    lark = re.sub(
        r"^%import\s+common\.ESCAPED_STRING\s*$", lambda _: _LARK_ESCAPED_STRING, lark, flags=re.M
    )
    return llguidance.LLMatcher.grammar_from_lark(lark)


def grammar_from_regex(regex: str) -> str:
    return llguidance.LLMatcher.grammar_from_regex(regex)


def gbnf_to_lark(gbnf: str) -> str:
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(gbnf)
    except Exception as e:  # the converter raises plain exceptions on bad input
        raise ConstraintError(f"the EBNF grammar cannot be parsed: {e}", keyword="ebnf") from e


class Prototype:
    """The compiled LLMatcher that per-request cursors copy.

    Copies share the lexer's lazily built automaton. When that automaton reaches llguidance's size
    limit ("too many expressions constructed"), every copy fails from then on; so a cursor that
    finds itself in an error state renews the prototype, and later requests get a fresh one.
    """

    __slots__ = ("grammar", "_tok", "_matcher", "_lock")

    def __init__(self, grammar: str, tok: TokenizerInfo, keyword: str) -> None:
        self.grammar, self._tok = grammar, tok
        self._lock = threading.Lock()
        self._matcher = _build(grammar, tok)
        if self._matcher.is_error():
            raise ConstraintError(_clean(self._matcher.get_error()), keyword=keyword)

    def copy(self) -> tuple[Any, Any]:
        """A fresh cursor and the prototype it was copied from."""
        source = self._matcher
        return source.deep_copy(), source

    def renew(self, broken_source: Any) -> None:
        with self._lock:
            if self._matcher is broken_source:
                self._matcher = _build(self.grammar, self._tok)


def _build(grammar: str, tok: TokenizerInfo) -> Any:
    return llguidance.LLMatcher(
        tok.llguidance, grammar, log_level=0, limits=llguidance.LLParserLimits(**LIMITS)
    )


def new_prototype(grammar: str, tok: TokenizerInfo, keyword: str) -> Prototype:
    """Build (compile) a prototype; a grammar error becomes a ConstraintError."""
    return Prototype(grammar, tok, keyword)


def _clean(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "the grammar was refused"


class LLGuidanceMatcher(Matcher):
    """A cursor over a deep copy of the compiled prototype matcher (the copy is cheap)."""

    __slots__ = ("_m", "_eos", "_ended", "_eos_unrecorded", "_prototype", "_source")

    def __init__(self, prototype: Prototype, eos_token_ids: frozenset[int]) -> None:
        self._prototype = prototype
        self._m, self._source = prototype.copy()
        self._eos = eos_token_ids
        self._ended = False  # an EOS was accepted
        # llguidance records nothing for an EOS taken once it has stopped by itself (e.g. after
        # the closing brace of a JSON root), so rollback must not hand that EOS to it.
        self._eos_unrecorded = False

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        # Row address by arithmetic (int32 words, rows contiguous): indexing the tensor would
        # cost more Python time than many of llguidance's masks take.
        ptr = bitmask.data_ptr() + row * bitmask.stride(0) * 4
        self._m.unsafe_compute_mask_ptr(ptr, bitmask.shape[1] * 4)
        self._check_health()
        return True

    def _check_health(self) -> None:
        if self._m.is_error():  # e.g. the shared lexer hit its limit: this cursor is done
            self._prototype.renew(self._source)

    def accept(self, token_id: int) -> bool:
        if token_id in self._eos:
            if self._ended or not self._m.is_accepting():
                return False
            if self._m.is_stopped():
                self._eos_unrecorded = True
            elif not self._m.consume_token(token_id):
                return False
            self._ended = True
            return True
        # try_consume_tokens leaves the matcher usable when the token is refused.
        if self._m.try_consume_tokens([token_id]) == 1:
            return True
        self._check_health()
        return False

    def rollback(self, n: int) -> None:
        if n and self._ended:
            self._ended = False
            if self._eos_unrecorded:
                self._eos_unrecorded = False
                n -= 1
        if n and not self._m.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: {self._m.get_error()}")

    def forced_continuation(self) -> bytes:
        return self._m.compute_ff_bytes()

    def is_terminated(self) -> bool:
        return self._m.is_stopped()

    def can_terminate(self) -> bool:
        return self._m.is_accepting()

    @property
    def error(self) -> str:
        return self._m.get_error()
