"""Differential mask checks: two engines walked over the same prefixes, their masks compared.

A random walk finds an unsound engine only when it happens to sample the one bad token; comparing
masks finds every token on which two engines disagree, at every position of every valid instance
either of them was walked along. A disagreement is not yet a bug (one of the two may simply be
right), so each one sampled is judged: the engine that allows the token completes the prefix
through it (a random walk biased towards closing, from that engine's own masks), and
``jsonschema`` judges the completed text.

- The completion is invalid: the permissive engine is **unsound** (its mask led to an instance
  the schema rejects), reported against it with that text.
- The completion is valid: the restrictive engine is **incomplete** (it forbids a token that
  begins a valid instance), reported against it with that text.
- The walk hits its length limit or a dead end: inconclusive, counted, not reported (a dead end
  is the walk stage's finding).

Special tokens other than EOS (chat markers, reserved ids) are counted but not judged: their
spelling is not text a model writes, so forbidding them inside JSON is right.

Findings are ordinary :class:`~corral.fuzz.case.Failure` objects of kind ``unsound`` /
``incomplete``, so the shrinker and the reproducers treat them like any other. The counts per
engine pair go in :class:`DiffStats`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from corral.fuzz import case as K
from corral.fuzz.case import Case, CaseResult
from corral.fuzz.judge import Judge, judge_output
from corral.fuzz.probe import TokenView, mask_bits, random_walk
from corral.fuzz.stats import LogHistogram
from corral.fuzz.targets import Target
from corral.grammar.core.walk import mask_accept_disagreements


@dataclass(frozen=True)
class DiffConfig:
    """Effort per case and engine pair."""

    max_paths: int = 12  # instances walked in lockstep
    max_positions: int = 400  # token positions compared, over all paths
    judged_per_position: int = 2  # disagreeing tokens completed and judged at one position
    max_judged: int = 40  # ... and over the whole case
    completion_tokens: int = 160
    # tokens per position and engine checked against that engine's own accept(), beside the
    # path's next token: as many the mask allows as it refuses
    self_checked: int = 6


@dataclass
class DiffStats:
    """What comparing one pair of engines on one case found (summed over cases by the report)."""

    positions: int = 0  # positions where both masks were compared
    differing: int = 0  # ... where they differed
    tokens: int = 0  # disagreeing tokens seen (allowed by exactly one of the two)
    special: int = 0  # ... of them special tokens (not judged: their spelling is not text)
    judged: int = 0  # disagreeing tokens completed and judged
    unsound: int = 0  # ... whose completion the judge rejected
    incomplete: int = 0  # ... whose completion the judge accepted
    inconclusive: int = 0  # ... whose completion did not end (length limit, dead end)
    self_checked: int = 0  # tokens whose mask bit was checked against the same engine's accept
    self_disagreed: int = 0  # ... on which the mask and accept() disagreed (a mismatch)

    def add(self, other: DiffStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _Engine:
    target: Target
    handle: Any
    hist: LogHistogram = field(default_factory=LogHistogram)

    def matcher_after(self, ids: list[int]) -> Any:
        """A fresh matcher that has accepted `ids` (None when it refuses one)."""
        m = self.target.matcher(self.handle)
        return m if m.accept_tokens(ids) == len(ids) else None


def compare(
    case: Case,
    result: CaseResult,
    a: tuple[Target, Any],
    b: tuple[Target, Any],
    paths: list[list[int]],
    judge: Judge,
    view: TokenView,
    cfg: DiffConfig,
    rng: random.Random,
) -> DiffStats:
    """Walk both engines along each token path, compare their masks at every position, judge a
    sample of the disagreements; findings go into `result` under the engine they convict."""
    stats = DiffStats()
    engines = (_Engine(*a), _Engine(*b))
    budget = {"positions": cfg.max_positions, "judged": cfg.max_judged}
    for ids in paths[: cfg.max_paths]:
        if budget["positions"] <= 0:
            break
        _walk_path(case, result, engines, ids, judge, view, cfg, rng, stats, budget)
    return stats


def _walk_path(
    case: Case,
    result: CaseResult,
    engines: tuple[_Engine, _Engine],
    ids: list[int],
    judge: Judge,
    view: TokenView,
    cfg: DiffConfig,
    rng: random.Random,
    stats: DiffStats,
    budget: dict[str, int],
) -> None:
    matchers = [e.target.matcher(e.handle) for e in engines]
    mask = view.new_mask()
    for i in range(len(ids) + 1):
        if budget["positions"] <= 0 or any(m.is_terminated() for m in matchers):
            return
        budget["positions"] -= 1
        bits = [mask_bits(m, mask, e.hist) for m, e in zip(matchers, engines, strict=True)]
        stats.positions += 1
        for m, e, allowed in zip(matchers, engines, bits, strict=True):
            _self_check(case, result, e, m, allowed, ids[i : i + 1], ids[:i], view, cfg, rng, stats)
        n = view.n_real  # a bit past the vocabulary is the walk stage's finding (beyond-vocab)
        differ = np.flatnonzero(bits[0][:n] != bits[1][:n])
        if len(differ):
            stats.differing += 1
            stats.tokens += len(differ)
            special = view.special[differ]
            stats.special += int(special.sum())
            differ = differ[~special]
            picks = rng.sample(list(differ), min(cfg.judged_per_position, len(differ)))
            for t in picks:
                if budget["judged"] <= 0:
                    break
                budget["judged"] -= 1
                allows = 0 if bits[0][t] else 1
                _judge_token(case, result, engines, allows, ids[:i], int(t), judge, view, cfg,
                             rng, stats)  # fmt: skip
        if i == len(ids) or not all(m.accept(ids[i]) for m in matchers):
            return


def _self_check(
    case: Case,
    result: CaseResult,
    engine: _Engine,
    m: Any,
    allowed: np.ndarray,
    next_ids: list[int],
    prefix: list[int],
    view: TokenView,
    cfg: DiffConfig,
    rng: random.Random,
    stats: DiffStats,
) -> None:
    """An engine's mask against its own accept(): the path's next token and a sample of the
    tokens the mask allows and refuses (specials and EOS aside) must get the same answer."""
    n = view.n_real
    plain = ~view.special[:n]
    plain[list(view.eos)] = False
    tokens = list(next_ids)
    for pool in (np.flatnonzero(allowed[:n] & plain), np.flatnonzero(~allowed[:n] & plain)):
        tokens += [int(t) for t in rng.sample(list(pool), min(cfg.self_checked, len(pool)))]
    stats.self_checked += len(tokens)
    found = mask_accept_disagreements(m, allowed, tokens)
    stats.self_disagreed += len(found)
    if not found:
        return
    t, by_mask = found[0]
    verdicts = ("allows", "refuses") if by_mask else ("refuses", "takes")
    detail = (
        f"mask and accept disagree: the mask {verdicts[0]} {view.token_bytes([t])!r} after "
        f"{len(prefix)} tokens ({view.token_bytes(prefix)[-40:]!r}), accept() {verdicts[1]} it"
    )
    out = result.outcomes[engine.target.name]
    if not any(
        f.kind == K.MISMATCH and f.detail.startswith("mask and accept") for f in out.failures
    ):
        text = view.token_bytes(prefix + [t]).decode("utf-8", errors="backslashreplace")
        out.failures.append(
            case.failure(engine.target.name, K.MISMATCH, text, detail, shrinkable=False)
        )


def _judge_token(
    case: Case,
    result: CaseResult,
    engines: tuple[_Engine, _Engine],
    allows: int,
    prefix: list[int],
    token: int,
    judge: Judge,
    view: TokenView,
    cfg: DiffConfig,
    rng: random.Random,
    stats: DiffStats,
) -> None:
    """Complete `prefix + [token]` with the engine that allows the token, and judge it."""
    stats.judged += 1
    yes, no = engines[allows], engines[1 - allows]
    if token in view.eos:
        text = view.token_bytes(prefix)
    else:
        m = yes.matcher_after(prefix + [token])
        if m is None:  # the mask allowed it, accept refused: the walk stage reports mismatches
            stats.inconclusive += 1
            return
        walk = random_walk(m, view, rng, cfg.completion_tokens, yes.hist)
        if walk.outcome not in ("eos", "terminated"):
            stats.inconclusive += 1
            return
        text = view.token_bytes(prefix + [token]) + walk.text
    judged = judge_output(judge, text)
    if judged is None:  # not judgeable as an instance (e.g. a float the judge cannot read)
        stats.inconclusive += 1
        return
    _, problem = judged
    spelled = view.token_bytes([token]) if token not in view.eos else b"<EOS>"
    where = f"after {len(prefix)} tokens ({view.token_bytes(prefix)[-40:]!r})"
    if problem:
        stats.unsound += 1
        detail = (
            f"mask difference: {yes.target.name} allows {spelled!r} {where}, "
            f"{no.target.name} does not, and the completion is invalid: {problem}"
        )
        _report(result, case, yes.target.name, K.UNSOUND, text, detail)
    else:
        stats.incomplete += 1
        detail = (
            f"mask difference: {no.target.name} forbids {spelled!r} {where}, "
            f"{yes.target.name} allows it, and a valid instance continues through it"
        )
        _report(result, case, no.target.name, K.INCOMPLETE, text, detail)


def _report(result: CaseResult, case: Case, target: str, kind: str, text: bytes, detail: str):
    out = result.outcomes[target]
    if any(f.kind == kind and f.detail.startswith("mask difference") for f in out.failures):
        return  # one differential finding per kind, engine and case; the counts keep the rest
    try:
        shown, replayable = text.decode("utf-8"), True
    except UnicodeDecodeError:
        shown, replayable = text.decode("utf-8", errors="backslashreplace"), False
    out.failures.append(case.failure(target, kind, shown, detail, shrinkable=replayable))
