"""The xgrammar backend: precomputed token-mask caches, the fastest masks once compiled."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import torch
import xgrammar

from corral.grammar.core.matcher import Matcher
from corral.grammar.core.tokenizer import TokenizerInfo

NAME = "xgrammar"
VERSION = importlib.metadata.version("xgrammar")


def _new_compiler(tok: TokenizerInfo) -> Any:
    return xgrammar.GrammarCompiler(tok.xgrammar, max_threads=1, cache_enabled=False)


def compiler_for(tok: TokenizerInfo) -> Any:
    """The tokenizer's one GrammarCompiler (kept by the tokenizer, ``TokenizerInfo.derived``);
    its own cache is off (Corral caches compiled forms)."""
    return tok.derived(_new_compiler)


def compile_ebnf(grammar: str, tok: TokenizerInfo) -> Any:
    return compiler_for(tok).compile_grammar(grammar)


def serialize(compiled: Any) -> bytes:
    return compiled.serialize_json().encode()


def deserialize(data: bytes, tok: TokenizerInfo) -> Any:
    return xgrammar.CompiledGrammar.deserialize_json(data.decode(), tok.xgrammar)


class XGrammarMatcher(Matcher):
    """A cursor over an xgrammar CompiledGrammar. xgrammar has no runtime limits to trip, so
    ``error()`` stays None; ``recover`` still rebuilds from the compiled grammar and replays."""

    __slots__ = ("_compiled", "_m", "_tokens")

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled
        self._m = xgrammar.GrammarMatcher(compiled)
        self._tokens: list[int] = []

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        if self._m.is_terminated():  # nothing may follow (quirks.RAISES_WHEN_TERMINATED)
            bitmask[row] = 0
            return True
        return bool(self._m.fill_next_token_bitmask(bitmask, row))

    def accept(self, token_id: int) -> bool:
        if self._m.accept_token(token_id):
            self._tokens.append(token_id)
            return True
        return False

    def _undo(self, n: int) -> None:
        self._m.rollback(n)

    def forced_continuation(self) -> bytes:
        if self._m.is_terminated():  # quirks.RAISES_WHEN_TERMINATED
            return b""
        return self._m.find_jump_forward_string().encode()

    def is_terminated(self) -> bool:
        return self._m.is_terminated()

    def can_terminate(self) -> bool:
        return self._m.is_completed()

    def recover(self) -> bool:
        """A new matcher from the compiled grammar, replayed over the accepted tokens."""
        tokens, self._tokens = self._tokens, []
        self._m = xgrammar.GrammarMatcher(self._compiled)
        if self.accept_tokens(tokens) == len(tokens):
            return True
        self._tokens = tokens
        return False
