"""A server's constraint runtime: what its requests share about its tokenizer and constraints.

One ``ConstraintRuntime`` per served tokenizer, owned by the server (``api.state.ServerState``;
never a module global, so two servers in one process share nothing). It holds

* the tokenizer (``TokenizerInfo``), which owns the token bytes (``token_bytes``: the grammar's
  exact bytes, from llguidance) and the indexes built over them;
* the budget closers of the constraints it served (``budget_close``): at most
  ``max_closers``, least recently used first out. A closer is complete before it is shared (its
  root's shortest instance worked out, a structural tag's calls found) and guarded after (its
  memos grow under its own lock: ``closing.shortest``).

A ``BudgetClose`` is what a request hands the engine (``SamplingParams.budget_close``): a closer
and the tokenizer it closes in, so budget closing reads token bytes from the same table the
grammar's masks are built from.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from corral.grammar.closing.partial_json import PartialJson
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.closing.tags import PartialTag, TagCloser
from corral.grammar.core.spec import ConstraintKind, ConstraintSpec
from corral.grammar.core.tokenizer import TokenizerInfo

#: Budget closers a runtime keeps (each holds an analysed schema and its memos).
MAX_CLOSERS = 256
_CLOSED_KINDS = frozenset(
    (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT, ConstraintKind.STRUCTURAL_TAG)
)


@dataclass(frozen=True, eq=False)
class BudgetClose:
    """Budget closing for one constraint in one tokenizer: its closer (a ``JsonCloser`` for a
    JSON schema or object, a ``TagCloser`` for a structural tag) and the ``TokenizerInfo`` whose
    token bytes it reads. Immutable; shared by every request with the constraint."""

    closer: JsonCloser | TagCloser
    tokenizer: TokenizerInfo

    @classmethod
    def for_spec(cls, spec: ConstraintSpec, tokenizer: TokenizerInfo) -> BudgetClose:
        """The budget closing of ``spec`` (see :func:`closes`), complete: the closer's answers
        for the output's start, and the tokenizer's tables it reads (once per tokenizer), are
        worked out here, off the engine's step loop."""
        if spec.kind is ConstraintKind.STRUCTURAL_TAG:
            closer: JsonCloser | TagCloser = TagCloser.for_spec(spec)  # finds its calls
        else:
            closer = JsonCloser.for_spec(spec)
            closer.shortest(closer.root)
        tokenizer.derived(byte_tokens)  # with the token bytes and the special ids
        return cls(closer, tokenizer)

    @property
    def tokenizer_fingerprint(self) -> str:
        """The tokenizer's (``TokenizerInfo.fingerprint``): the engine refuses another's."""
        return self.tokenizer.fingerprint

    def start(self) -> PartialJson | PartialTag:
        """A parser of the output, before its first character."""
        if isinstance(self.closer, TagCloser):
            return self.closer.start()
        return PartialJson.empty(self.closer)

    def token_bytes(self, token: int) -> bytes:
        """The bytes of ``token`` (``TokenizerInfo.token_bytes``)."""
        return self.tokenizer.token_bytes[token]

    def byte_token(self, byte: int) -> int | None:
        """The token that is exactly the one byte ``byte`` (None when the vocabulary has none)."""
        return self.tokenizer.derived(byte_tokens)[byte]

    @property
    def special_ids(self) -> frozenset[int]:
        return self.tokenizer.derived(special_ids)

    def encode(self, text: str) -> list[int]:
        """``text`` as tokens (no special tokens added)."""
        return self.tokenizer.encode(text)


def closes(spec: ConstraintSpec) -> bool:
    """Whether ``spec`` has budget closing: a JSON schema, a JSON object or a structural tag
    (tool calls), not after a reasoning block."""
    return spec.kind in _CLOSED_KINDS and not spec.reasoning


class ConstraintRuntime:
    """One server's constraint state for its tokenizer (see the module). Thread-safe."""

    def __init__(self, tokenizer: TokenizerInfo, max_closers: int = MAX_CLOSERS) -> None:
        self.tokenizer = tokenizer
        self.max_closers = max_closers
        self._lock = threading.Lock()
        self._closers: OrderedDict[ConstraintSpec, BudgetClose] = OrderedDict()

    @property
    def token_bytes(self) -> tuple[bytes, ...]:
        """Every token's bytes, as the grammar matches them (``TokenizerInfo.token_bytes``)."""
        return self.tokenizer.token_bytes

    def budget_close(self, spec: ConstraintSpec) -> BudgetClose | None:
        """``spec``'s budget closing (None where it has none: :func:`closes`), built on first use
        and kept. Runs the schema analysis on a miss: call it off the event loop. Two threads
        missing at once may both build it; both get the one that is kept."""
        if not closes(spec):
            return None
        with self._lock:
            found = self._closers.get(spec)
            if found is not None:
                self._closers.move_to_end(spec)
                return found
        built = BudgetClose.for_spec(spec, self.tokenizer)  # complete before it is shared
        with self._lock:
            found = self._closers.setdefault(spec, built)
            self._closers.move_to_end(spec)
            while len(self._closers) > self.max_closers:
                self._closers.popitem(last=False)
        return found

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"budget_closers": len(self._closers)}


# Tables built once per tokenizer and kept by it (``TokenizerInfo.derived``).


def byte_tokens(tok: TokenizerInfo) -> tuple[int | None, ...]:
    """For each byte value, the first token that is exactly that byte and not a special token
    (None where there is none): how a closing finishes a character a token split."""
    specials = tok.derived(special_ids)
    found: list[int | None] = [None] * 256
    for token, data in enumerate(tok.token_bytes):
        if len(data) == 1 and found[data[0]] is None and token not in specials:
            found[data[0]] = token
    return tuple(found)


def special_ids(tok: TokenizerInfo) -> frozenset[int]:
    """The tokenizer's special token ids (``all_special_ids``)."""
    return frozenset(getattr(tok.hf_tokenizer, "all_special_ids", ()))
