"""Sampling glue: penalties, the grammar mask, min_tokens, logprobs, then `mask_kernels.sample`.

One call handles every logits row of a step. A row is described by a `RowSpec`: its sequence,
the output position it samples (the RNG offset, so a seeded row's draw does not depend on the
batch), and for jump-forward verification rows the draft tokens assumed before it (they count
for the penalties and for `min_tokens` exactly as they would token by token).

Order per row: repetition penalty (tokens of prompt + output), frequency/presence penalties
(output), the grammar mask, then the `min_tokens` ban of EOS and stop tokens, which is lifted
for a row where it would leave nothing allowed (the grammar wins: it allows only EOS there).

Seeds: an n > 1 request's choices draw from seeds derived from the request's (`choice_seeds`),
so each is reproducible on its own yet they differ.

Logprobs are those of the masked distribution at temperature 1, after penalties (what
`mask_kernels.sample` reports for the sampled token); `top_logprobs` come from the same one and
omit masked alternatives (-inf), so they may be fewer than asked; every value is finite.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from corral.engine.core import Sequence, TokenLogprob
from corral.mask_kernels import SamplingTensors, apply_bitmask_, sample

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads the seeds of an n > 1 request's choices apart


@dataclass
class RowSpec:
    """One logits row to sample: `seq` at output position `offset`, after `assumed` drafts."""

    seq: Sequence
    offset: int
    assumed: list[int]


def choice_seeds(seed: int | None, n: int) -> list[int]:
    """The seed of each of a request's `n` choices: from `seed`, or from a fresh random one
    when the request gave none."""
    base = seed if seed is not None else random.getrandbits(62)
    return [(base ^ (i * _SEED_MIX)) & ((1 << 63) - 1) for i in range(n)]


def sample_rows(
    logits: torch.Tensor,
    specs: list[RowSpec],
    bitmask: torch.Tensor | None = None,
    mask_rows: torch.Tensor | None = None,
    eos: frozenset[int] = frozenset(),
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row of `logits` (modified in place); logprobs where asked.
    `eos`: the model's EOS ids (banned with the stop tokens until `min_tokens`)."""
    _apply_penalties(logits, specs)
    if bitmask is not None and bitmask.shape[0]:
        apply_bitmask_(logits, bitmask, mask_rows)
    _ban_early_stops(logits, specs, eos)
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
    """Repetition (prompt + output), then frequency/presence (output) penalties, all rows at
    once; only rows that ask for a penalty are touched."""
    rows = [i for i, s in enumerate(specs) if s.seq.params.penalized]
    if not rows:
        return
    dev, dtype = logits.device, logits.dtype
    params = [specs[i].seq.params for i in rows]
    counts = _output_counts(specs, rows, logits.shape[1], dtype, dev)
    idx = torch.tensor(rows, device=dev)
    sub = logits[idx]
    if any(p.repetition_penalty != 1 for p in params):
        seen = counts > 0
        for r, i in enumerate(rows):
            if params[r].repetition_penalty != 1:
                seen[r, _prompt_ids(specs[i].seq, dev)] = True
        rp = torch.tensor([p.repetition_penalty for p in params], dtype=dtype, device=dev)
        rp = rp.unsqueeze(1)
        sub = torch.where(seen, torch.where(sub > 0, sub / rp, sub * rp), sub)
    if any(p.frequency_penalty or p.presence_penalty for p in params):
        freq = torch.tensor([p.frequency_penalty for p in params], dtype=dtype, device=dev)
        pres = torch.tensor([p.presence_penalty for p in params], dtype=dtype, device=dev)
        sub = sub - (freq[:, None] * counts + pres[:, None] * (counts > 0).to(dtype))
    logits[idx] = sub


def _output_counts(
    specs: list[RowSpec], rows: list[int], vocab: int, dtype: torch.dtype, dev: torch.device
) -> torch.Tensor:
    """float[len(rows), V]: how often each token occurs in the row's output (+ assumed drafts)."""
    row_idx, tok_idx = [], []
    for r, i in enumerate(rows):
        spec = specs[i]
        toks = spec.seq.output_ids + spec.assumed
        row_idx.extend([r] * len(toks))
        tok_idx.extend(toks)
    counts = torch.zeros(len(rows), vocab, dtype=dtype, device=dev)
    if tok_idx:
        ri = torch.tensor(row_idx, device=dev)
        ti = torch.tensor(tok_idx, device=dev).clamp_(max=vocab - 1)
        counts.index_put_((ri, ti), torch.ones(len(ti), dtype=dtype, device=dev), accumulate=True)
    return counts


def _prompt_ids(seq: Sequence, dev: torch.device) -> torch.Tensor:
    """The distinct token ids of `seq`'s prompt, made once per sequence."""
    ids = seq.seen_prompt
    if ids is None or ids.device != dev:
        ids = seq.seen_prompt = torch.tensor(sorted(set(seq.prompt_ids)), device=dev)
    return ids


def _ban_early_stops(logits: torch.Tensor, specs: list[RowSpec], eos: frozenset[int]) -> None:
    """`min_tokens`: EOS (unless `ignore_eos`) and stop tokens become -inf on rows sampling an
    output position below it, except on rows where nothing else would be left."""
    rows, row_idx, tok_idx, owner = [], [], [], []
    vocab = logits.shape[1]
    for i, spec in enumerate(specs):
        p = spec.seq.params
        if spec.offset >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids) if p.ignore_eos else eos.union(p.stop_token_ids)
        banned = [t for t in banned if 0 <= t < vocab]
        if banned:
            row_idx.extend([i] * len(banned))
            tok_idx.extend(banned)
            owner.extend([len(rows)] * len(banned))
            rows.append(i)
    if not rows:
        return
    dev = logits.device
    ri, ti = torch.tensor(row_idx, device=dev), torch.tensor(tok_idx, device=dev)
    saved = logits[ri, ti]
    logits[ri, ti] = float("-inf")
    dead = logits[torch.tensor(rows, device=dev)].amax(dim=1) == float("-inf")
    logits[ri, ti] = torch.where(dead[torch.tensor(owner, device=dev)], saved, logits[ri, ti])


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
        pairs = zip(ids[r, :n].tolist(), values[r, :n].tolist(), strict=True)
        out[i] = tuple((t, v) for t, v in pairs if math.isfinite(v))  # masked ones omitted
    return out
