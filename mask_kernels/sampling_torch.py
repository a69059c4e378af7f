"""Sampling semantics in torch: the CPU path, and the filter thresholds both paths share.

The sampled distribution of a row is: mask → temperature → top-k → top-p (of what top-k kept,
renormalised) → min-p, each filter keeping tokens at or above a threshold *logit*, ties kept.
All three filters keep a prefix of the tokens in logit order, so together they are one per-row
threshold ``thr`` on the raw (masked) logit, and the draw is a Gumbel-max race among the
survivors:

    token = argmax_{i allowed, logit_i >= thr} (logit_i / T + gumbel(seed, offset, i))

Comparing raw logits against a threshold that is itself a logit value is exact on every device,
so the CPU and the GPU kernels draw the same survivor set. Greedy rows (T <= 0) take the argmax of
the masked logits (first index on ties) and ignore the filters.
"""

from __future__ import annotations

import math

import torch

from .params import SampleResult, SamplingTensors
from .rng import gumbel_noise, row_keys

NEG_INF = float("-inf")


def greedy_and_inverse_temperature(params: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """(greedy bool[B], 1/T float32[B] with 1.0 on greedy rows)."""
    greedy = params.temperature <= 0
    safe_t = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    return greedy, safe_t.reciprocal()


def min_p_threshold(row_max: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """p_i >= min_p * p_max  <=>  logit_i >= max + T * log(min_p)  (-inf where min-p is off)."""
    log_min_p = torch.log(params.min_p.clamp(min=1e-30))
    thr = row_max + params.temperature.clamp(min=0) * log_min_p
    return torch.where(params.min_p > 0, thr, torch.full_like(thr, NEG_INF))


def sorted_threshold(masked: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """The top-k/top-p threshold per row, from one descending sort of the masked logits."""
    vocab = masked.shape[1]
    ordered = masked.sort(dim=1, descending=True).values.float()
    k_index = (params.top_k.to(torch.int64) - 1).clamp(0, vocab - 1).unsqueeze(1)
    kth = ordered.gather(1, k_index).squeeze(1)
    thr_k = torch.where(params.top_k > 0, kth, torch.full_like(kth, NEG_INF))
    # top-p looks at what top-k kept, renormalised: the smallest prefix whose mass reaches top_p.
    kept = torch.where(ordered >= thr_k.unsqueeze(1), ordered, torch.full_like(ordered, NEG_INF))
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0)
    probs = torch.softmax(kept / temperature.unsqueeze(1), dim=1)
    below = (probs.cumsum(dim=1) < params.top_p.unsqueeze(1)).sum(dim=1)
    pth = ordered.gather(1, below.clamp(max=vocab - 1).unsqueeze(1)).squeeze(1)
    thr_p = torch.where(params.top_p < 1, pth, torch.full_like(pth, NEG_INF))
    return torch.maximum(thr_k, thr_p)


def row_threshold(
    masked: torch.Tensor, row_max: torch.Tensor | None, params: SamplingTensors
) -> torch.Tensor | None:
    """The combined filter threshold per row (a raw logit; -inf = no filter), or None if unused."""
    thr = None
    if params.uses_top_k_or_top_p:
        thr = sorted_threshold(masked, params)
    if params.uses_min_p:
        if row_max is None:
            row_max = masked.amax(dim=1).float()
        thr_m = min_p_threshold(row_max, params)
        thr = thr_m if thr is None else torch.maximum(thr, thr_m)
    if thr is None:
        return None
    return torch.where(params.temperature > 0, thr, torch.full_like(thr, NEG_INF))


def log_normaliser(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, logsumexp) per row of float32 x; rows of all -inf give (-inf, -inf)."""
    row_max = x.amax(dim=1)
    shift = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    total = torch.exp(x - shift.unsqueeze(1)).sum(dim=1)
    return row_max, shift + torch.log(total)


def finish(
    best_score: torch.Tensor,
    best_index: torch.Tensor,
    logits: torch.Tensor,
    lse: torch.Tensor | None,
) -> SampleResult:
    """Turn the winning (score, index) per row into tokens (-1: nothing allowed) and logprobs
    (NaN when ``lse`` is None: nobody asked for them)."""
    empty = best_score == NEG_INF
    tokens = torch.where(empty, torch.full_like(best_index, -1), best_index)
    if lse is None:
        return SampleResult(tokens, torch.full(tokens.shape, math.nan, device=tokens.device))
    chosen = logits.gather(1, tokens.clamp(min=0).unsqueeze(1)).squeeze(1).float()
    logprobs = torch.where(empty, torch.full_like(chosen, NEG_INF), chosen - lse)
    return SampleResult(tokens, logprobs)


def sample_torch(x: torch.Tensor, params: SamplingTensors) -> SampleResult:
    """Sample from already-masked logits ``x`` [B, V] (any float dtype) with torch ops."""
    xf = x.float()
    row_max, lse = log_normaliser(xf) if params.logprobs else (None, None)
    thr = row_threshold(x, row_max, params)
    greedy, inv_t = greedy_and_inverse_temperature(params)
    if params.all_greedy:
        score = xf
    else:
        key_a, key_b = row_keys(params.seed, params.offset)
        noisy = torch.addcmul(gumbel_noise(key_a, key_b, x.shape[1]), xf, inv_t.unsqueeze(1))
        score = torch.where(greedy.unsqueeze(1), xf, noisy)
    if thr is not None:
        score = score.masked_fill(xf < thr.unsqueeze(1), NEG_INF)
    # -inf logits stay -inf whatever the (finite) noise, so an all-masked row scores -inf.
    best_index = score.argmax(dim=1)
    best_score = score.gather(1, best_index.unsqueeze(1)).squeeze(1)
    return finish(best_score, best_index, x, lse)
