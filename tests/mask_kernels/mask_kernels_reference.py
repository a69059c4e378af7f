"""A plain reference for the mask kernels, written from the spec and sharing no code with them.

Bits are unpacked with numpy's ``unpackbits``, the hash runs in numpy uint32 (wrapping natively)
and pure Python ints, and sampling is done row by row in float64 with an explicit sort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

M32 = 0xFFFFFFFF


def allowed_tokens(words: np.ndarray, vocab: int) -> np.ndarray:
    """bool[vocab] for one bitmask row: bit i of word j allows token 32j+i; beyond the mask: no."""
    bits = np.unpackbits(words.astype("<u4").view(np.uint8), bitorder="little").astype(bool)
    out = np.zeros(vocab, dtype=bool)
    n = min(vocab, bits.size)
    out[:n] = bits[:n]
    return out


def apply_reference(logits: torch.Tensor, bitmask: torch.Tensor, rows) -> torch.Tensor:
    """A masked copy of ``logits`` (any float dtype): disallowed -> -inf, others untouched."""
    out = logits.clone()
    words = bitmask.cpu().numpy()
    targets = range(words.shape[0]) if rows is None else [int(r) for r in rows]
    for i, row in enumerate(targets):
        disallowed = torch.from_numpy(~allowed_tokens(words[i], logits.shape[1]))
        out[row, disallowed.to(out.device)] = float("-inf")
    return out


def mix_int(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x5BD1E995) & M32
    return x ^ (x >> 16)


def mix_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x5BD1E995)
    return x ^ (x >> np.uint32(16))


def uniforms(seed: int, offset: int, vocab: int) -> np.ndarray:
    """u(seed, offset, token) for every token, float64 (the values are exact float32 numbers)."""
    key_a = mix_int(mix_int(mix_int(mix_int((seed & M32) ^ 0x2545F491) ^ ((seed >> 32) & M32))
                            ^ (offset & M32)) ^ ((offset >> 32) & M32))  # fmt: skip
    key_b = mix_int(key_a ^ 0x68E31DA4)
    tokens = np.arange(vocab, dtype=np.uint32)
    h = mix_np(mix_np(tokens + np.uint32(key_a)) ^ np.uint32(key_b))
    return ((h >> np.uint32(9)).astype(np.float64) * 2 + 1) / 2.0**24


@dataclass
class RowParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    offset: int = 0


def threshold(x: np.ndarray, p: RowParams) -> tuple[float, bool]:
    """(the filter threshold logit, whether a float32 implementation may decide differently)."""
    finite = x[np.isfinite(x)]
    if p.temperature <= 0 or finite.size == 0:
        return -math.inf, False
    desc = np.sort(finite)[::-1]
    thr_k = desc[min(p.top_k, desc.size) - 1] if p.top_k > 0 else -math.inf
    fragile = False
    thr_p = -math.inf
    if p.top_p < 1:
        kept = desc[desc >= thr_k] / p.temperature
        probs = np.exp(kept - kept[0])
        probs /= probs.sum()
        cum = np.cumsum(probs)
        idx = int(np.searchsorted(cum, p.top_p, side="left"))  # first cum >= top_p
        thr_p = desc[min(idx, desc.size - 1)]
        fragile = bool(np.any(np.abs(cum - p.top_p) < 1e-5))
    thr_m = -math.inf
    if p.min_p > 0:
        thr_m = desc[0] + p.temperature * math.log(p.min_p)
        fragile = fragile or bool(np.any(np.abs(finite - thr_m) < 1e-5 * (1 + abs(thr_m))))
    return max(thr_k, thr_p, thr_m), fragile


def distribution(x: np.ndarray, p: RowParams) -> np.ndarray:
    """The renormalised distribution a sampled (T > 0) row draws from, float64[V]."""
    thr, _ = threshold(x, p)
    keep = np.isfinite(x) & (x >= thr)
    z = np.where(keep, x / p.temperature, -np.inf)
    w = np.exp(z - z[keep].max())
    return w / w.sum()


def sample_row(x: np.ndarray, p: RowParams) -> tuple[int, float, bool]:
    """(token, logprob, fragile) for one masked row ``x`` (float64; -inf = disallowed)."""
    finite = np.isfinite(x)
    if not finite.any():
        return -1, -math.inf, False
    top = x[finite].max()
    logprob_of = lambda t: float(x[t] - top - math.log(np.exp(x[finite] - top).sum()))  # noqa: E731
    if p.temperature <= 0:
        token = int(np.argmax(np.where(finite, x, -np.inf)))
        return token, logprob_of(token), False
    thr, fragile = threshold(x, p)
    g = -np.log(-np.log(uniforms(p.seed, p.offset, x.size)))
    score = np.where(finite & (x >= thr), x / p.temperature + g, -np.inf)
    token = int(np.argmax(score))
    ranked = np.sort(score[np.isfinite(score)])
    if ranked.size > 1 and ranked[-1] - ranked[-2] < 1e-4 * (1 + abs(ranked[-1])):
        fragile = fragile or ranked[-1] != ranked[-2]
    return token, logprob_of(token), fragile


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom > x), from the closed forms for integer df."""
    half = x / 2
    if df % 2 == 0:
        term = total = math.exp(-half)
        for i in range(1, df // 2):
            term *= half / i
            total += term
        return total
    total = math.erfc(math.sqrt(half))
    for k in range(1, df - 1, 2):  # sf(k + 2) = sf(k) + half^(k/2) e^-half / Gamma(k/2 + 1)
        total += math.exp((k / 2) * math.log(half) - half - math.lgamma(k / 2 + 1))
    return total
