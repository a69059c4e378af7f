"""The llguidance backend: near-instant compiles, refuses what it cannot enforce."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from typing import Any

import llguidance
import torch

from corral.grammar.backends.llg_limits import LIMITS, classify, effective_limits, first_line
from corral.grammar.backends.quirks import LARK_ESCAPED_STRING
from corral.grammar.core.errors import ConstraintError
from corral.grammar.core.input_checks import nesting_error
from corral.grammar.core.matcher import Matcher
from corral.grammar.core.spec import JsonFormat
from corral.grammar.core.tokenizer import TokenizerInfo
from corral.grammar.schema.backend_merges import pattern_keys_first

NAME = "llguidance"
VERSION = llguidance.__version__

__all__ = [
    "LIMITS",
    "NAME",
    "VERSION",
    "LLGuidanceMatcher",
    "Prototype",
    "new_prototype",
    "try_consume",
]


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
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(pattern_keys_first(schema)), overrides=json_options(fmt)
        )
    except ValueError as e:  # llguidance's own JSON reader refused it (e.g. its depth limit)
        raise refusal(str(e), "schema") from None


def grammar_from_lark(lark: str) -> str:
    """The llguidance grammar of a Lark grammar, whose ``common.ESCAPED_STRING`` means Lark's
    own (``quirks.LARK_ESCAPED_STRING_TAKES_NEWLINE``)."""
    lark = re.sub(
        r"^%import\s+common\.ESCAPED_STRING\s*$", lambda _: LARK_ESCAPED_STRING, lark, flags=re.M
    )
    return llguidance.LLMatcher.grammar_from_lark(lark)


def grammar_from_regex(regex: str) -> str:
    return llguidance.LLMatcher.grammar_from_regex(regex)


def gbnf_to_lark(gbnf: str) -> str:
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(gbnf)
    except RecursionError:  # the converter's parser recurses once per nesting level
        raise nesting_error("EBNF grammar") from None
    except Exception as e:  # the converter raises plain exceptions on bad input
        raise ConstraintError(f"the EBNF grammar cannot be parsed: {e}", keyword="ebnf") from e


class Prototype:
    """The compiled LLMatcher that per-request cursors copy, and the limits it was built with.

    ``raised`` are the limits above llguidance's defaults that the compile-time probe found this
    grammar needs (``llg_limits.RAISED``); ``CORRAL_LLG_LIMITS`` is applied on top at every build.
    Copies share the lexer's lazily built automaton. When that automaton reaches llguidance's size
    limit, every copy fails from then on; ``renew`` replaces it (``Matcher.recover`` calls it).
    """

    __slots__ = ("grammar", "raised", "_tok", "_matcher", "_lock")

    def __init__(
        self,
        grammar: str,
        tok: TokenizerInfo,
        keyword: str,
        raised: Mapping[str, int] | None = None,
    ) -> None:
        self.grammar, self._tok = grammar, tok
        self.raised = dict(raised or {})
        self._lock = threading.Lock()
        self._matcher = _build(grammar, tok, self.raised)
        if self._matcher.is_error():
            raise refusal(self._matcher.get_error(), keyword)

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    def copy(self) -> tuple[Any, Any]:
        """A fresh cursor and the prototype it was copied from."""
        source = self._matcher
        return source.deep_copy(), source

    def renew(self, broken_source: Any) -> None:
        """Rebuild the prototype, unless another cursor already replaced ``broken_source``."""
        with self._lock:
            if self._matcher is broken_source:
                self._matcher = _build(self.grammar, self._tok, self.raised)


def _build(grammar: str, tok: TokenizerInfo, raised: Mapping[str, int]) -> Any:
    limits = llguidance.LLParserLimits(**effective_limits(raised))
    return llguidance.LLMatcher(tok.llguidance, grammar, log_level=0, limits=limits)


def new_prototype(
    grammar: str, tok: TokenizerInfo, keyword: str, raised: Mapping[str, int] | None = None
) -> Prototype:
    """Build (compile) a prototype; a grammar error becomes a ConstraintError."""
    return Prototype(grammar, tok, keyword, raised)


def refusal(message: str, keyword: str) -> ConstraintError:
    """The ConstraintError for a backend message, naming the limit when it reports one."""
    line = first_line(message) or "the grammar was refused"
    limit, advice = classify(line)
    if limit is None:
        return ConstraintError(line, keyword=keyword)
    return ConstraintError(f"{advice} (llguidance: {line})", keyword=keyword, limit=limit)


def try_consume(matcher: Any, tokens: list[int]) -> int:
    """Consume ``tokens`` until one is refused; how many were taken.

    ``try_consume_tokens`` may refuse a token that would pass a runtime limit just as it refuses
    one the grammar forbids, and leave the matcher healthy
    (``quirks.TRY_CONSUME_HIDES_LEXER_LIMIT``). So a refused token is tried once more on a copy
    (about 6 us): when the copy fails on a limit, the matcher takes the copy's error state, so
    that ``is_error()`` tells the truth.
    """
    n = matcher.try_consume_tokens(tokens)
    if n < len(tokens):
        trial = matcher.deep_copy()
        if not trial.consume_token(tokens[n]) and classify(trial.get_error())[0] is not None:
            matcher.consume_token(tokens[n])  # the same state, and the same error, as the trial
    return n


class LLGuidanceMatcher(Matcher):
    """A cursor over a deep copy of the compiled prototype matcher (the copy is cheap).

    It records the tokens it accepted (``rollback`` trims the record), so that ``recover`` can
    rebuild it from the prototype and replay them when llguidance has put it in its error state.
    """

    __slots__ = (
        "_m",
        "_eos",
        "_ended",
        "_eos_unrecorded",
        "_prototype",
        "_source",
        "_tokens",
        "_lost",
    )

    def __init__(self, prototype: Prototype, eos_token_ids: frozenset[int]) -> None:
        self._prototype = prototype
        self._eos = eos_token_ids
        self._tokens: list[int] = []
        self._fresh_cursor()

    def _fresh_cursor(self) -> None:
        self._m, self._source = self._prototype.copy()
        self._ended = False  # an EOS was accepted
        # An EOS taken once llguidance has stopped by itself is not recorded, so rollback must
        # not hand that EOS to it (quirks.EOS_AFTER_STOP_UNRECORDED).
        self._eos_unrecorded = False
        self._lost: str | None = None  # set when a replay could not rebuild the state

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        # Row address by arithmetic (int32 words, rows contiguous): indexing the tensor would
        # cost more Python time than many of llguidance's masks take.
        ptr = bitmask.data_ptr() + row * bitmask.stride(0) * 4
        self._m.unsafe_compute_mask_ptr(ptr, bitmask.shape[1] * 4)
        return True

    def native_cursor(self) -> Any:
        return self._m

    def accept(self, token_id: int) -> bool:
        if token_id in self._eos:
            if self._ended or not self._m.is_accepting():
                return False
            if self._m.is_stopped():
                self._eos_unrecorded = True
            elif not self._m.consume_token(token_id):
                return False
            self._ended = True
            self._tokens.append(token_id)
            return True
        # Where the grammar forces bytes, the mask allows only the first token of their
        # canonical tokenization, and so does accept (quirks.FORCED_BYTES_MASK_ONE_SPELLING).
        forced = self._m.compute_ff_tokens()
        if forced and token_id != forced[0]:
            return False
        # A refused token leaves the matcher usable, unless it failed on a runtime limit.
        if try_consume(self._m, [token_id]) == 1:
            self._tokens.append(token_id)
            return True
        return False

    def _undo(self, n: int) -> None:
        if self._m.is_error():
            # A refused token (say, the next of a speculative draft) hit a limit after these n:
            # rebuilt where the rollback leads, the cursor is healthy again.
            if not self._rebuild(self._tokens):
                raise ValueError(f"cannot roll back {n} tokens: {self.error()}")
            return
        if self._ended:
            self._ended = False
            if self._eos_unrecorded:
                self._eos_unrecorded = False
                n -= 1
        if n and not self._m.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: {first_line(self._m.get_error())}")

    def forced_continuation(self) -> bytes:
        return self._m.compute_ff_bytes()

    def is_terminated(self) -> bool:
        # An errored matcher reads as stopped (quirks.ERROR_READS_AS_STOPPED): not finished.
        return self._m.is_stopped() and not self._m.is_error()

    def can_terminate(self) -> bool:
        return self._m.is_accepting() and not self._m.is_error()

    def error(self) -> str | None:
        """llguidance's message (its first line) once the cursor is in its error state."""
        if self._lost is not None:
            return self._lost
        if not self._m.is_error():
            return None
        return first_line(self._m.get_error()) or "the grammar matcher is in an error state"

    def recover(self) -> bool:
        """A fresh copy of the prototype, replayed over the accepted tokens; if that fails too,
        the prototype is rebuilt (its shared lexer may be what is full) and replayed once more."""
        tokens = self._tokens
        if self._rebuild(tokens):
            return True
        self._prototype.renew(self._source)
        return self._rebuild(tokens)

    def _rebuild(self, tokens: list[int]) -> bool:
        """A fresh cursor replayed over ``tokens``; True when it is healthy. Otherwise the record
        still holds ``tokens`` (what the sequence accepted) and ``error()`` says why."""
        self._tokens = []
        self._fresh_cursor()
        if self._replay(tokens) and self.error() is None:
            return True
        self._tokens = list(tokens)
        if self.error() is None:
            self._lost = "the grammar matcher could not be rebuilt over the tokens accepted so far"
        return False

    def _replay(self, tokens: list[int]) -> bool:
        body = tokens[:-1] if tokens and tokens[-1] in self._eos else tokens
        if try_consume(self._m, body) != len(body):
            return False
        self._tokens = list(body)
        return len(body) == len(tokens) or self.accept(tokens[-1])
