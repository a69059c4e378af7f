"""Sampling glue: penalties, the grammar mask, logprobs, then `mask_kernels.sample`.

One call handles every logits row of a step. A row is described by a `RowSpec`: its sequence,
the output position it samples (the RNG offset, so a seeded row's draw does not depend on the
batch), and for jump-forward verification rows the draft tokens assumed before it (they count
for the presence/frequency penalties exactly as they would token by token).

Logprobs are those of the masked distribution at temperature 1, after penalties (what
`mask_kernels.sample` reports for the sampled token); `top_logprobs` come from the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corral.engine.core import Sequence, TokenLogprob
from corral.mask_kernels import SamplingTensors, apply_bitmask_, sample


@dataclass
class RowSpec:
    """One logits row to sample: `seq` at output position `offset`, after `assumed` drafts."""

    seq: Sequence
    offset: int
    assumed: list[int]


def sample_rows(
    logits: torch.Tensor,
    specs: list[RowSpec],
    bitmask: torch.Tensor | None = None,
    mask_rows: torch.Tensor | None = None,
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row of `logits` (modified in place); logprobs where asked."""
    _apply_penalties(logits, specs)
    if bitmask is not None and bitmask.shape[0]:
        apply_bitmask_(logits, bitmask, mask_rows)
    top = _top_logprobs(logits, specs)
    result = sample(logits, None, _tensors(specs, logits.device))
    tokens = result.tokens.tolist()
    if top is None:
        return tokens, [None] * len(specs)
    lps = result.logprobs.tolist()
    out: list[TokenLogprob | None] = []
    for i, spec in enumerate(specs):
        if not spec.seq.params.wants_logprobs:
            out.append(None)
            continue
        out.append(TokenLogprob(tokens[i], lps[i], top.get(i, ())))
    return tokens, out


def _tensors(specs: list[RowSpec], device: torch.device) -> SamplingTensors:
    ps = [s.seq.params for s in specs]
    return SamplingTensors.build(
        temperature=[p.temperature for p in ps],
        top_k=[p.top_k for p in ps],
        top_p=[p.top_p for p in ps],
        min_p=[p.min_p for p in ps],
        seed=[s.seq.seed for s in specs],
        offset=[s.offset for s in specs],
        device=device,
    )


def _apply_penalties(logits: torch.Tensor, specs: list[RowSpec]) -> None:
    """OpenAI presence/frequency penalties over the output tokens so far, all rows at once."""
    rows = [i for i, s in enumerate(specs) if s.seq.params.penalized]
    if not rows:
        return
    vocab = logits.shape[1]
    row_idx, tok_idx = [], []
    for r, i in enumerate(rows):
        spec = specs[i]
        toks = spec.seq.output_ids + spec.assumed
        row_idx.extend([r] * len(toks))
        tok_idx.extend(toks)
    counts = torch.zeros(len(rows), vocab, dtype=logits.dtype, device=logits.device)
    if tok_idx:
        ri = torch.tensor(row_idx, device=logits.device)
        ti = torch.tensor(tok_idx, device=logits.device).clamp_(max=vocab - 1)
        counts.index_put_((ri, ti), torch.ones(len(ti), dtype=logits.dtype), accumulate=True)
    freq = torch.tensor([specs[i].seq.params.frequency_penalty for i in rows], dtype=logits.dtype)
    pres = torch.tensor([specs[i].seq.params.presence_penalty for i in rows], dtype=logits.dtype)
    penalty = freq[:, None] * counts + pres[:, None] * (counts > 0).to(logits.dtype)
    idx = torch.tensor(rows, device=logits.device)
    logits[idx] = logits[idx] - penalty.to(logits.device)


def _top_logprobs(
    logits: torch.Tensor, specs: list[RowSpec]
) -> dict[int, tuple[tuple[int, float], ...]] | None:
    """The `top_logprobs` alternatives per row (None when no row wants logprobs at all)."""
    want = [i for i, s in enumerate(specs) if s.seq.params.wants_logprobs]
    if not want:
        return None
    k = max(specs[i].seq.params.top_logprobs for i in want)
    if k == 0:
        return {}
    idx = torch.tensor(want, device=logits.device)
    lp = torch.log_softmax(logits[idx].float(), dim=-1)
    values, ids = lp.topk(k, dim=-1)
    out = {}
    for r, i in enumerate(want):
        n = specs[i].seq.params.top_logprobs
        out[i] = tuple(zip(ids[r, :n].tolist(), values[r, :n].tolist(), strict=True))
    return out
