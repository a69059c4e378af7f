"""Driving a matcher: random walks through its masks, and token-by-token instance checks.

Both read the mask the engine computed (what a sampler would see), not only ``accept``: a token
counts as allowed when its bit is set, and an ``accept`` that refuses a token the mask allowed is
reported as an engine inconsistency.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np
import torch

from corral.fuzz.stats import LogHistogram
from corral.grammar import Matcher, TokenizerInfo


class TokenView:
    """What the probes need to know about a tokenizer: token bytes, EOS ids, closing tokens."""

    def __init__(self, tok: TokenizerInfo) -> None:
        self.tok = tok
        self.eos = frozenset(tok.eos_token_ids)
        self.n_real = tok.tokenizer_vocab_size
        self._bytes = tok.token_bytes[: self.n_real]
        is_single = np.zeros(32 * tok.mask_words, dtype=bool)
        is_closing = np.zeros(32 * tok.mask_words, dtype=bool)
        for i, b in enumerate(self._bytes):
            if i in self.eos:
                continue
            is_single[i] = len(b) == 1
            is_closing[i] = bool(b) and all(c in b'"}]' for c in b)
        self.single, self.closing = is_single, is_closing
        # Special tokens other than EOS (chat markers, reserved ids): their spelling is not text
        # a model writes, so an engine forbidding them inside JSON is right, not incomplete.
        hf = tok.hf_tokenizer
        special = set(hf.all_special_ids)
        special |= {i for i, t in hf.added_tokens_decoder.items() if t.special}
        self.special = np.zeros(32 * tok.mask_words, dtype=bool)
        self.special[[i for i in special - self.eos if i < self.n_real]] = True

    def token_bytes(self, ids: list[int]) -> bytes:
        return b"".join(self._bytes[i] for i in ids if i not in self.eos)

    def encode(self, text: str) -> list[int]:
        """Tokens of ``text`` as plain text: a special token's spelling inside a JSON string
        stays ordinary characters, as it would in any model's output."""
        hf = self.tok.hf_tokenizer
        return hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def new_mask(self) -> torch.Tensor:
        return torch.zeros((1, self.tok.mask_words), dtype=torch.int32)


def _bits(mask: torch.Tensor) -> np.ndarray:
    return np.unpackbits(mask[0].numpy().view(np.uint8), bitorder="little").astype(bool)


def mask_bits(m: Matcher, mask: torch.Tensor, hist: LogHistogram) -> np.ndarray:
    """The tokens `m` allows now, one bool per token id (its fill time goes into `hist`)."""
    t0 = time.perf_counter()
    restricted = m.fill_mask(mask, 0)
    hist.add(time.perf_counter() - t0)
    if not restricted:
        return np.ones(mask.shape[1] * 32, dtype=bool)
    return _bits(mask)


@dataclass
class Walk:
    """One random walk: ``outcome`` is eos · terminated · truncated · dead-end · empty ·
    mismatch · beyond-vocab; ``text`` is the bytes generated (EOS excluded)."""

    outcome: str
    text: bytes
    tokens: int
    detail: str = ""


def random_walk(
    m: Matcher, view: TokenView, rng: random.Random, max_tokens: int, hist: LogHistogram
) -> Walk:
    """Sample allowed tokens until EOS; biased towards ending once half the budget is used."""
    mask, ids = view.new_mask(), []
    eos = sorted(view.eos)
    while len(ids) < max_tokens:
        if m.is_terminated():
            return Walk("terminated", view.token_bytes(ids), len(ids))
        allowed = mask_bits(m, mask, hist)
        if allowed[view.n_real :].any():
            bad = int(np.flatnonzero(allowed[view.n_real :])[0]) + view.n_real
            return Walk("beyond-vocab", view.token_bytes(ids), len(ids), f"token {bad} allowed")
        t = _choose(allowed, eos, view, rng, late=len(ids) >= max_tokens // 2)
        if t is None:
            return Walk("empty" if not ids else "dead-end", view.token_bytes(ids), len(ids))
        if not m.accept(t):
            detail = f"mask allowed token {t} ({view.token_bytes([t])!r}) but accept refused it"
            return Walk("mismatch", view.token_bytes(ids), len(ids), detail)
        if t in view.eos:
            return Walk("eos", view.token_bytes(ids), len(ids))
        ids.append(t)
    return Walk("truncated", view.token_bytes(ids), len(ids))


def _choose(
    allowed: np.ndarray, eos: list[int], view: TokenView, rng: random.Random, late: bool
) -> int | None:
    eos_ok = [t for t in eos if allowed[t]]
    if eos_ok and rng.random() < (0.8 if late else 0.1):
        return rng.choice(eos_ok)
    pools = []
    if late:
        pools.append(allowed & view.closing)
    if rng.random() < 0.5:  # single bytes explore structure (digits, quotes, brackets, escapes)
        pools.append(allowed & view.single)
    pools.append(allowed)
    for pool in pools:
        ids = np.flatnonzero(pool[: view.n_real])
        if len(ids):
            return int(ids[rng.randrange(len(ids))])
    return rng.choice(eos_ok) if eos_ok else None


@dataclass
class Check:
    """Token-by-token check of a text: ``accepted`` when every token and then EOS was allowed.
    ``position`` is the index of the first refused token (== len(tokens) if EOS was refused)."""

    accepted: bool
    position: int
    tokens: int
    detail: str = ""


def check_tokens(m: Matcher, view: TokenView, ids: list[int], hist: LogHistogram) -> Check:
    mask = view.new_mask()
    for i, t in enumerate(ids):
        if m.is_terminated():
            return Check(False, i, len(ids), "the engine had already terminated")
        if not mask_bits(m, mask, hist)[t]:
            return Check(False, i, len(ids), f"token {i} ({view.token_bytes([t])!r}) masked")
        if not m.accept(t):
            detail = f"token {i} ({view.token_bytes([t])!r}) allowed by the mask, refused by accept"
            return Check(False, i, len(ids), detail)
    if m.is_terminated():
        return Check(True, len(ids), len(ids))
    allowed = mask_bits(m, mask, hist)
    if any(allowed[t] for t in view.eos):
        return Check(True, len(ids), len(ids))
    return Check(False, len(ids), len(ids), "EOS masked after the last token")
