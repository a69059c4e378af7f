"""Budget closing: JSON that is complete when `max_tokens` runs out.

Invariant, kept before every appended token t of a steered sequence: L(after t) <= the tokens
left after t, where L(state) is the token length of a closing sequence C known to exist from
that state (`grammar.shortest`, or `grammar.tag_close` for tool calls: the shortest completion
text, tokenized). When taking t would break it, t is not taken: C from the current state is
appended instead (all of it, like jump-forward's forced tokens), the sequence ends with finish
reason "length", and the report names the JSON pointers C cut short. So whenever
`max_tokens` >= L(start), the output is a complete instance the matcher accepts.

Exactness of the parts:
- C is checked before it is relied on: it is run through the sequence's own matcher (accepted,
  `can_terminate`, rolled back). A C the matcher refuses (a schema shape `grammar.shortest`
  does not model) is replaced by a mask-guided completion within the tokens left; if that
  fails too the sequence is not steered and the report says `complete: false`.
- Per-step cost: the new token's characters are parsed incrementally and C is recomputed from
  the open frames (cost: the depth). It is only tokenized when its UTF-8 byte length exceeds
  the tokens left (every token holds at least one byte, so below that it surely fits).
- A token's text is its bytes as the grammar matches them: the closing's tokenizer
  (`grammar.core.runtime.BudgetClose`) reads them from `TokenizerInfo.token_bytes`, the table
  the masks are built from, whatever the tokenizer's kind (byte-level BPE, byte fallback,
  added tokens). Nothing here is kept between sequences but in that tokenizer.
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

import torch

from corral.engine.serving.core import BudgetReport, Sequence
from corral.grammar.closing.shortest import listed_values

if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.grammar.closing.partial_json import PartialJson
    from corral.grammar.closing.tags import PartialTag
    from corral.grammar.core.runtime import BudgetClose
    from corral.grammar.core.tokenizer import TokenizerInfo


# A partial UTF-8 character at the end of the output is completed with these continuation
# bytes (the second byte's range depends on the lead byte; the rest are 0x80).
_SECOND_BYTE = {0xE0: 0xA0, 0xF0: 0x90}
_GREEDY_CHARS = '"}]0a,:1tn'  # tried first by the mask-guided fallback, in order


class BudgetSteer:
    """The budget-closing state of one sequence (`Sequence.budget`)."""

    def __init__(self, seq: Sequence, max_model_len: int, buf: torch.Tensor) -> None:
        """`buf`: a scratch `int32[1, W]` bitmask for the mask-guided fallback."""
        self.closing: BudgetClose = seq.params.budget_close  # type: ignore[assignment]
        self.buf = buf
        self.max_model_len = max_model_len
        self.partial: PartialJson | PartialTag = self.closing.start()
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.active = True
        self.steered = False
        self.cut: tuple[str, ...] = ()
        self.reason = ""  # why it is not steering, once it is not
        room = self.room(seq)
        need = self._length(self.partial, b"", room)
        if need is None:
            self._stop("no shortest valid instance was found for this schema")
        elif need > room:
            self._stop(f"{room} tokens are below the shortest valid instance ({need} tokens)")

    def room(self, seq: Sequence) -> int:
        """Output tokens `seq` may still append."""
        return min(seq.params.max_tokens - len(seq.output_ids), self.max_model_len - seq.num_tokens)

    def _stop(self, reason: str) -> None:
        self.active, self.reason = False, reason

    def admits(self, seq: Sequence, tok: int) -> bool:
        """Whether `seq` may take `tok` and keep the invariant; commits the parse when it may."""
        if not self.active or (tok in self.closing.special_ids and _ends(seq, tok)):
            return True  # a stop token that ends a complete output is no text to close
        decoder = codecs.getincrementaldecoder("utf-8")()
        decoder.setstate(self.decoder.getstate())
        trial = self.partial.copy()
        trial.feed(decoder.decode(self.closing.token_bytes(tok)))
        need = self._length(trial, decoder.getstate()[0], self.room(seq) - 1)
        if need is None or need > self.room(seq) - 1:
            return False
        self.partial, self.decoder = trial, decoder
        return True

    def _length(self, partial: PartialJson | PartialTag, pending: bytes, room: int) -> int | None:
        """Tokens of C from `partial` (+ `pending` bytes of a split character), or an upper
        bound of them that already fits in `room`; None when C is unknown."""
        found = closing_after(partial, pending)
        if found is None:
            return None
        head, text, _ = found
        if len(head) + len(text.encode()) <= room:
            return len(head) + len(text.encode())
        return len(head) + len(self.closing.encode(text))

    def close(self, seq: Sequence, append: Callable[[int], None]) -> bool:
        """Append C from the current state (verified first) and end `seq` as "length"; False
        (and steering off, reported) when no closing sequence was found."""
        self.active = False
        room = self.room(seq)
        found = closing_after(self.partial, self.decoder.getstate()[0])
        tokens = None
        if found is not None:
            head, text, cut = found
            spelt = [self.closing.byte_token(b) for b in head]
            if None not in spelt:  # else a byte has no token of its own: greedy below
                tokens = [*spelt, *self.closing.encode(text)]  # type: ignore[list-item]
            self.cut = tuple(sorted(set(cut)))
        if tokens is None or len(tokens) > room or not _verified(seq, tokens):
            tokens = greedy_close(seq, room, self.closing.tokenizer, self.buf)
            self.cut = ()
        if tokens is None:
            self._stop("no closing sequence found")
            return False
        self.steered = True
        for t in tokens:
            if seq.finish_reason is None:
                append(t)
        return True

    def report(self, seq: Sequence) -> BudgetReport | None:
        """What budget closing did for a finished `seq` (None where it played no part)."""
        if self.steered:
            return BudgetReport(True, self.cut, seq.matcher.can_terminate())
        if seq.finish_reason == "length" or self.reason:
            complete = seq.matcher is not None and seq.matcher.can_terminate()
            return BudgetReport(False, (), complete, self.reason or None)
        return None


def closing_after(
    partial: PartialJson | PartialTag, pending: bytes
) -> tuple[bytes, str, list] | None:
    """C from `partial` followed by `pending`, the first bytes of a character: the bytes that
    finish the character, the closing text after it, and the pointers it cuts short."""
    if not pending:
        found = partial.closing()
        return None if found is None else (b"", found[0], found[1])
    for head in _char_ends(partial, pending):
        trial = partial.copy()
        trial.feed((pending + head).decode("utf-8", "replace"))
        found = trial.closing()
        if found is not None:
            return head, found[0], found[1]
    return None


def _char_ends(partial: PartialJson | PartialTag, pending: bytes) -> list[bytes]:
    """Bytes that finish the character `pending` begins: those of each listed string the open
    string may still become (its own next character), then the smallest valid ones. (Outside a
    JSON string, in a tool call's free text for one, only the smallest valid ones.)"""
    size = _utf8_len(pending[0])
    filler = bytes([_SECOND_BYTE.get(pending[0], 0x80)]) + b"\x80" * 3
    ends = []
    top = partial.open_string()
    for node in top.schemas if top is not None else ():
        for v in listed_values(node) or ():
            if isinstance(v, str) and v.startswith(top.text) and not top.escape:
                spelt = v[len(top.text) :].encode()
                if spelt.startswith(pending) and len(spelt) >= size:
                    ends.append(spelt[len(pending) : size])
    return [*dict.fromkeys(ends), filler[: size - len(pending)]]


def _ends(seq: Sequence, tok: int) -> bool:
    """Whether `seq`'s matcher takes `tok` and is finished after it (state unchanged)."""
    m = seq.matcher
    if not m.can_terminate() or not m.accept(tok):
        return False
    done = m.is_terminated()
    m.rollback(1)
    return done


def _verified(seq: Sequence, tokens: list[int]) -> bool:
    """Whether `seq`'s matcher accepts `tokens` and may end after them (state unchanged)."""
    m = seq.matcher
    n = m.accept_tokens(tokens)
    ok = n == len(tokens) and m.can_terminate()
    m.rollback(n)
    return ok


def greedy_close(
    seq: Sequence, limit: int, tokenizer: TokenizerInfo, buf: torch.Tensor
) -> list[int] | None:
    """A closing sequence of at most `limit` tokens found with the grammar's masks: each step
    takes the first allowed of a few one-character tokens that close or shorten JSON, else
    the first allowed token. The matcher is left as it was."""
    m, out = seq.matcher, []
    greedy = tokenizer.derived(_greedy_ids)
    try:
        while not m.can_terminate():
            if len(out) >= limit:
                return None
            m.fill_mask(buf, 0)
            allowed = _allowed(buf[0])
            pick = next((t for t in greedy if t in allowed), None)
            pick = pick if pick is not None else min(allowed, default=None)
            if pick is None or not m.accept(pick):
                return None
            out.append(pick)
        return out
    finally:
        m.rollback(len(out))


def _allowed(row: torch.Tensor) -> set[int]:
    words = row.nonzero().flatten().tolist()
    out = set()
    for j in words:
        w = int(row[j]) & 0xFFFFFFFF
        out.update(32 * j + i for i in range(32) if w >> i & 1)
    return out


def _greedy_ids(tokenizer: TokenizerInfo) -> tuple[int, ...]:
    """The one-token spellings of `_GREEDY_CHARS`, in order (built once per tokenizer, kept by
    it: `TokenizerInfo.derived`)."""
    ids = [tokenizer.encode(ch) for ch in _GREEDY_CHARS]
    return tuple(i[0] for i in ids if len(i) == 1)


def _utf8_len(lead: int) -> int:
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
