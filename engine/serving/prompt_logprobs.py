"""Prompt logprobs (`SamplingParams.prompt_logprobs_from`): what the model thinks of each prompt
token, read from extra logits rows of the prefill pass.

The logits at prompt position i score token i + 1. A sequence asking from token p gets the
logprob of every prompt token from p on given the tokens before it (token 0 has none: nothing
precedes it), so it needs the logits of positions max(p, 1) - 1 .. len(prompt) - 2; the last
position's logits are its sampling row as usual. Each step's chunk asks for those of its positions not computed yet (a preempted sequence
resumes where it stopped: the prefix cache is reused up to there only, `Sequence.reuse_limit`).
The rows follow the step's sampling rows in `ForwardBatch.logits_index`; `take` splits them off
before sampling. Values are the model's own distribution (log-softmax of the raw logits): no
penalty, grammar mask or temperature applies to a prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corral.engine.serving.core import Sequence, TokenLogprob


@dataclass
class PromptRows:
    """`seq`'s prompt logits rows in one step: the positions' next tokens, in order."""

    seq: Sequence
    targets: list[int]


def rows_for(seq: Sequence, first: int, end: int) -> list[int]:
    """The prompt positions in `[first, end)` (a chunk being fed) whose logits `seq` still
    needs for its prompt logprobs."""
    start = first_position(seq)
    if start is None:
        return []
    lo = max(first, start + len(seq.prompt_logprobs))
    hi = min(end, len(seq.prompt_ids) - 1)
    return list(range(lo, hi))


def first_position(seq: Sequence) -> int | None:
    """The first prompt position whose logits `seq`'s prompt logprobs need (None: none)."""
    start = seq.params.prompt_logprobs_from
    return None if start is None else max(start, 1) - 1


def take(logits: torch.Tensor, rows: list[PromptRows]) -> None:
    """Score each `PromptRows`' targets from its rows of `logits` (in order) and append the
    results to its sequence's `prompt_logprobs`."""
    if not rows:
        return
    lp = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor([t for r in rows for t in r.targets], dtype=torch.int64)
    chosen = lp.gather(1, targets.to(lp.device).unsqueeze(1)).squeeze(1).tolist()
    k = max(r.seq.params.top_logprobs for r in rows)
    top_ids: list[list[int]] = []
    top_values: list[list[float]] = []
    if k:
        values, ids = lp.topk(k, dim=-1)
        top_ids, top_values = ids.tolist(), values.tolist()
    at = 0
    for r in rows:
        want = r.seq.params.top_logprobs
        for target in r.targets:
            top = tuple(zip(top_ids[at][:want], top_values[at][:want], strict=True)) if want else ()
            r.seq.prompt_logprobs.append(TokenLogprob(target, chosen[at], top))
            at += 1


def pending(seq: Sequence) -> tuple[TokenLogprob, ...] | None:
    """The prompt logprobs to send with `seq`'s next output: all of them, once, as soon as the
    prompt is prefilled; None before, after, and for a sequence that did not ask."""
    if seq.params.prompt_logprobs_from is None or seq.prompt_logprobs_sent:
        return None
    if seq.num_computed < len(seq.prompt_ids) - 1 and not seq.finished:
        return None
    seq.prompt_logprobs_sent = True
    return tuple(seq.prompt_logprobs)
