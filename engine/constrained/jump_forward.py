"""Jump-forward: output tokens obtained without a forward pass each.

All three are exact: greedy and seeded outputs are the same with jump-forward on or off.

1. Forced tokens. When the grammar mask allows exactly one token, sampling could only pick that
   token (whatever the temperature, filters or penalties), so it is appended at once, without a
   forward pass for its selection. Its KV is computed in the next extend, together with the
   rest. The random draw of a position is fixed by (seed, output position), so skipping a draw
   does not shift later ones. Requests that want logprobs are not forced: theirs must come from
   a real distribution.
2. Drafts. The bytes the grammar forces next are tokenized and fed after the sequence's
   uncomputed tokens in the same extend; each draft position gets a logits row and is sampled
   exactly as token-by-token decoding would, so a fully accepted k-token draft yields k + 1
   tokens (the last row gives the "bonus" token) for one pass, and a wrong guess costs only
   the rejected tail.
3. Lookup drafts (prompt-lookup speculation, `engine.constrained.lookup`). After the
   grammar's forced text (or where it forces nothing), the tokens that followed the latest
   earlier occurrence of the sequence's longest suffix n-gram (in the prompt or the output)
   are drafted, cut at the first token the grammar refuses (`accepted_after`). They are
   verified the same way, so they too change no output; they pay off where the text repeats
   itself (spans copied from the prompt, arrays of similar objects). Unconstrained sequences
   get them too.
4. The end of a reasoning budget (`SamplingParams.reasoning_budget`, with or without a
   grammar). When the output reaches the budget inside the think block, the block's end marker
   is appended as forced tokens, so the block holds at most that many tokens of the model's own
   and the constraint after it applies as usual. Drafts are cut so that no step crosses the
   budget: the check runs exactly where the output reaches it.

How drafts are tokenized. The forced text is tokenized together with the last output tokens (the
canonical tokenization of output + forced text, already-emitted tokens kept fixed); where that
re-tokenization would change an emitted token, the forced text is tokenized alone. Where the
forced text ends, free text follows, and the model often splits the last forced token
differently from the canonical tokenization (e.g. `":` then `"` rather than `":"` before a string
value); `DraftHints` learns such splits from verification results and applies them to the
draft's last token while the model keeps preferring them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from corral.engine.constrained.masks import accept_checked, fill_checked
from corral.engine.serving.core import Sequence

_CONTEXT_TOKENS = (3, 1)  # output tokens tried as tokenization context, longest first
_MAX_SCORE = 8  # |preference| cap, so a hint adapts when the model's habit changes
_MAX_HINTS = 4096


@dataclass(frozen=True)
class Boundary:
    """The draft's boundary token `whole` (canonical) at draft position `pos`; `split` says
    whether the draft holds its split form instead."""

    pos: int
    whole: int
    split: bool


class DraftHints:
    """How the model tokenizes the end of forced text, learned online (engine-wide).

    For a canonical last draft token `whole` whose text the model instead started with a
    shorter token `head`, the split `head, rest` (`rest` a single token) is remembered; a score
    counts how often the model took the split (+1) or the whole token (-1) at the boundary.
    """

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self._splits: dict[int, tuple[int, int]] = {}
        self.score: Counter[int] = Counter()

    def shape(self, draft: list[int]) -> tuple[list[int], Boundary | None]:
        """`draft` with its last token split when the model preferred that so far."""
        if not draft:
            return draft, None
        whole, pos = draft[-1], len(draft) - 1
        split = self._splits.get(whole)
        if split is not None and self.score[whole] > 0:
            return draft[:-1] + list(split), Boundary(pos, whole, True)
        return draft, Boundary(pos, whole, False)

    def observe(self, boundary: Boundary | None, draft: list[int], got: list[int]) -> None:
        """Learn from one verification: `got` are the tokens appended for `draft`."""
        if boundary is None or len(draft) <= boundary.pos or len(got) <= boundary.pos:
            return  # the boundary token was not fed or not reached: nothing learned
        if got[: boundary.pos] != draft[: boundary.pos]:
            return
        picked, whole = got[boundary.pos], boundary.whole
        if picked == whole:
            self._vote(whole, -1)
        elif boundary.split and picked == draft[boundary.pos]:
            self._vote(whole, +1)
        elif not boundary.split:
            rest = self._rest(whole, picked)
            if rest is not None:
                if len(self._splits) >= _MAX_HINTS:
                    self._splits.clear()
                    self.score.clear()
                self._splits[whole] = (picked, rest)
                self._vote(whole, +1)

    def _vote(self, whole: int, delta: int) -> None:
        self.score[whole] = max(-_MAX_SCORE, min(_MAX_SCORE, self.score[whole] + delta))

    def _rest(self, whole: int, head: int) -> int | None:
        """The single token that completes `head` into `whole`'s text, if there is one."""
        whole_s, head_s = self._tok.convert_ids_to_tokens([whole, head])
        if not isinstance(whole_s, str) or not isinstance(head_s, str):
            return None
        if len(head_s) >= len(whole_s) or not whole_s.startswith(head_s):
            return None
        rest = self._tok.convert_tokens_to_ids(whole_s[len(head_s) :])
        unk = getattr(self._tok, "unk_token_id", None)
        return rest if isinstance(rest, int) and rest != unk else None


def make_draft(seq: Sequence, tokenizer, limit: int, hints: DraftHints | None = None) -> list[int]:
    """Tokens of the grammar's forced continuation after `seq`'s output (at most `limit`);
    sets `seq.draft_hint` for `DraftHints.observe`. Only tokens the matcher accepts are kept
    (the matcher is rolled back afterwards)."""
    seq.draft_hint = None
    if limit <= 0 or seq.matcher is None:
        return []
    text = _utf8_prefix(seq.matcher.forced_continuation())
    if not text:
        return []
    draft = _tokenize_after(seq.output_ids, tokenizer, text)
    if len(draft) > limit:
        draft = draft[:limit]  # cut inside the forced text: its last token meets no free text
    elif hints is not None:
        draft, seq.draft_hint = hints.shape(draft)
        draft = draft[:limit]
    ok = accepted_after(seq, [], draft)
    if seq.draft_hint is not None and seq.draft_hint.pos >= ok:
        seq.draft_hint = None
    return draft[:ok]


def accepted_after(seq: Sequence, prefix: list[int], more: list[int]) -> int:
    """How many leading `more` tokens `seq`'s matcher accepts after `prefix` (tokens it is
    known to accept); the matcher is left as it was. Unconstrained: all of them. A matcher in
    error is recovered once (`masks.accept_checked`) or fails the sequence."""
    m = seq.matcher
    if m is None or not more:
        return len(more)
    done = 0
    for tok in prefix:
        if not accept_checked(m, tok):
            m.rollback(done)
            return 0
        done += 1
    ok = 0
    for tok in more:
        if not accept_checked(m, tok):
            break
        ok += 1
    m.rollback(done + ok)
    return ok


def reasoning_close(seq: Sequence, tokenizer) -> list[int]:
    """The end marker's tokens when `seq`'s output has just reached its reasoning budget inside
    the think block; else none."""
    budget = seq.params.reasoning_budget
    if budget is None or len(seq.output_ids) != budget.tokens:
        return []
    text = tokenizer.decode(seq.output_ids, skip_special_tokens=False)
    if budget.close in text or not text.lstrip().startswith(budget.open):
        return []
    return _tokenize_after(seq.output_ids, tokenizer, budget.close)


def budget_room(seq: Sequence) -> int | None:
    """How many more draft tokens `seq` may feed without passing its reasoning budget (a draft
    of k yields up to k + 1 tokens); None when no budget is ahead."""
    budget = seq.params.reasoning_budget
    if budget is None or len(seq.output_ids) >= budget.tokens:
        return None
    return budget.tokens - len(seq.output_ids) - 1


def _tokenize_after(output: list[int], tokenizer, text: str) -> list[int]:
    """`text`'s tokens as the canonical tokenization of output + text would have them."""
    for k in _CONTEXT_TOKENS:
        if len(output) < k:
            continue
        tail = output[-k:]
        tail_text = tokenizer.decode(tail, skip_special_tokens=False)
        if not tail_text or "\ufffd" in tail_text:
            continue
        joint = tokenizer.encode(tail_text + text, add_special_tokens=False)
        if len(joint) > k and joint[:k] == tail:
            return joint[k:]
    return tokenizer.encode(text, add_special_tokens=False)


def forced_token(seq: Sequence, buf: torch.Tensor) -> int | None:
    """The only token `seq`'s grammar allows now, or None (also for logprob requests).

    `buf` is a scratch `int32[1, W]` bitmask (all ones when the grammar allows everything,
    which never forces a token). The mask is only computed where one token can be
    the only choice: forced bytes ahead or EOS allowed (with a byte-level vocabulary every
    allowed first byte is a token of its own, so otherwise two or more tokens are allowed).
    """
    m = seq.matcher
    if m is None or seq.params.wants_logprobs or m.is_terminated():
        return None
    if not m.forced_continuation() and not m.can_terminate():
        return None
    fill_checked(m, buf, 0)  # a matcher in error is recovered once, or fails the sequence
    row = buf[0]
    words = row.nonzero()
    if words.numel() != 1:
        return None
    j = int(words[0, 0])
    word = int(row[j]) & 0xFFFFFFFF
    if word & (word - 1):
        return None
    return 32 * j + word.bit_length() - 1


def _utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is whole UTF-8 characters, decoded."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
