"""Prompt-lookup speculation: drafts mined from a sequence's own prompt and output.

Extraction copies spans of its document: the tokens after the latest earlier occurrence of the
sequence's last few tokens are a cheap, often right guess of what comes next. `LookupIndex`
finds the longest suffix n-gram (`EngineConfig.lookup_min_ngram` .. `lookup_max_ngram` tokens)
of prompt + output that occurred before and proposes what followed it; `Proposer` sizes each
proposal from the sequence's recent acceptance (`SpecState`). A proposal is only a draft: the
engine verifies it in the same forward pass as every other row (`jump_forward`, `postprocess`),
cut first at the first token the grammar refuses, so it never changes an output.

Adaptive k. Every draft token costs a row of the step's forward (a constrained row also a mask
fill): `EngineConfig.lookup_row_cost` is that row's cost as a share of a one-token decode pass
(on the CPU the 4-bit matmul decodes its weights once per two rows, so a row is far from free;
on a GPU a few more rows cost almost nothing). Each sequence estimates how often its next draft
token is right (`SpecState`) and drafts the k that maximizes tokens per unit of cost, 0 where
no k beats plain decoding. After `_MISSES_OFF` proposals in a row that got nothing it stops,
and probes again with a 1-token proposal after a cooldown that doubles after each failed probe
(`_PROBE_STEPS` .. `_MAX_PROBE_STEPS` steps).

Devices. A draft is fed after its sequence's token in one extend span (`serving.step_inputs`;
its one-token decode rows are switched off, see there), so a verify step runs the layer-by-layer
path on the CPU and eagerly on CUDA, never a captured decode graph. Each extra row costs its
share of every matmul, which is what `lookup_row_cost` prices.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.engine.serving.core import Sequence

_MISSES_OFF = 3  # proposals in a row that got nothing before k drops to 0
_PROBE_STEPS = 8  # steps at k = 0 before the first probe
_MAX_PROBE_STEPS = 256
_DECAY = 0.9  # weight of the past in the acceptance estimate, per verified proposal


class LookupIndex:
    """Where each n-gram (every n in [min_n, max_n]) of one sequence's tokens last ended, kept
    incrementally (a sequence's tokens only ever grow at the end)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> the position right after it
        self._indexed = 0  # positions ending before this have every n-gram indexed

    def _index(self, seq: Sequence, end: int) -> None:
        """Index every n-gram ending at a position in [_indexed, end)."""
        if self._indexed >= end:
            return
        lo = max(0, self._indexed - self.max_n)
        ids = seq.tokens(lo, end)
        last = self._last
        for stop in range(max(self._indexed, 1), end + 0):
            # n-grams ending right before `stop` (ids[stop - n : stop]) map to stop
            j = stop - lo
            for n in range(self.min_n, min(self.max_n, stop) + 1):
                last[tuple(ids[j - n : j])] = stop
        self._indexed = end

    def propose(self, seq: Sequence, tail: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens after the latest earlier occurrence of the longest suffix
        n-gram of prompt + output + `tail` (`tail`: draft tokens already proposed after the
        output, e.g. the grammar's forced text); none when no n-gram of min_n occurred."""
        end = seq.num_tokens
        if limit <= 0 or end + len(tail) <= self.min_n:
            return []
        # n-grams ending before `end` are indexed: an occurrence that ends at `end` itself is the
        # suffix, not an earlier one (its continuation is what we try to guess)
        self._index(seq, end)
        need = self.max_n - len(tail)
        context = (seq.tokens(max(0, end - need), end) if need > 0 else []) + tail
        context = context[-self.max_n :]
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            start = self._last.get(tuple(context[-n:]))
            if start is not None:
                return seq.tokens(start, min(start + limit, end))
        return []


@dataclass
class SpecState:
    """One sequence's speculation: its estimated per-token acceptance, misses in a row,
    cooldown, and counts.

    Acceptance is modelled as geometric: each next draft token is right with probability p,
    estimated from decayed counts of confirmed tokens (`hits`) and first wrong ones (`misses_w`).
    A k-token draft then yields 1 + p + ... + p^k tokens for a pass that costs 1 + row_cost * k
    decode passes; `allowance` picks the k in [0, max_k] that maximizes their ratio (0 when no k
    beats plain decoding).
    """

    hits: float = 3.0  # a prior of p = 0.75: a new sequence tries one token
    misses_w: float = 1.0
    misses: int = 0  # proposals in a row that got nothing
    cooldown: int = 0  # steps left at k = 0 before a probe
    probe_steps: int = _PROBE_STEPS
    proposed: int = 0  # lookup draft tokens fed for verification
    accepted: int = 0  # of those, confirmed by the sampled tokens

    @property
    def p(self) -> float:
        return self.hits / (self.hits + self.misses_w)

    def settle(self, proposed: int, accepted: int) -> None:
        """Learn from one verified proposal of `proposed` tokens, `accepted` of them right."""
        if proposed <= 0:
            return
        self.proposed += proposed
        self.accepted += accepted
        self.hits = _DECAY * self.hits + accepted
        self.misses_w = _DECAY * self.misses_w + (accepted < proposed)
        if accepted:
            self.misses, self.probe_steps = 0, _PROBE_STEPS
            return
        self.misses += 1
        if self.misses >= _MISSES_OFF:
            self.cooldown = self.probe_steps
            self.probe_steps = min(_MAX_PROBE_STEPS, 2 * self.probe_steps)
            self.misses = _MISSES_OFF - 1  # a failed probe turns it off again

    def allowance(self, max_k: int, row_cost: float) -> int:
        """This step's k: the best one for the estimated p (see class docstring), or a 1-token
        probe once a cooldown has run out (counting one step of it when off)."""
        if self.cooldown > 0:
            self.cooldown -= 1
            return 0
        if self.misses >= _MISSES_OFF - 1 and self.misses > 0:
            return 1  # probing after a cooldown
        p, gain, best, best_ratio = self.p, 1.0, 0, 1.0
        term = 1.0
        for k in range(1, max_k + 1):
            term *= p
            gain += term
            ratio = gain / (1.0 + row_cost * k)
            if ratio > best_ratio:
                best, best_ratio = k, ratio
        if best == 0:  # nothing pays now: wait, then probe (which updates the estimate)
            self.cooldown, self.misses = self.probe_steps, _MISSES_OFF - 1
        return best


class Proposer:
    """Lookup drafts for every running sequence (`EngineConfig.speculative`)."""

    def __init__(
        self, min_n: int, max_n: int, max_k: int, min_tokens: int, row_cost: float
    ) -> None:
        self.min_n, self.max_n, self.max_k, self.min_tokens = min_n, max_n, max_k, min_tokens
        self.row_cost = row_cost

    def applies(self, seq: Sequence) -> bool:
        """Whether `seq` speculates at all: on for the engine and the request, a k above 0,
        an output started (a prompt alone proposes nothing useful), enough tokens to mine."""
        return (
            self.max_k > 0
            and seq.params.speculative
            and bool(seq.output_ids)
            and seq.num_tokens >= self.min_tokens
        )

    def propose(self, seq: Sequence, tail: list[int], limit: int) -> list[int]:
        """Up to min(`limit`, the sequence's k) tokens proposed after output + `tail`."""
        if seq.spec is None:
            seq.spec = SpecState()
        k = min(limit, seq.spec.allowance(self.max_k, self.row_cost))
        if k <= 0:
            return []
        if seq.lookup is None:
            seq.lookup = LookupIndex(self.min_n, self.max_n)
        return seq.lookup.propose(seq, tail, k)

    def settle(self, seq: Sequence, proposed: int, accepted: int) -> None:
        if seq.spec is not None:
            seq.spec.settle(proposed, accepted)
