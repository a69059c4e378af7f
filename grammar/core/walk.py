"""Driving a matcher over whole token sequences: the checks that tests, benches and fuzzing share."""

from __future__ import annotations

import random
import time

import numpy as np
import torch

from corral.grammar.core.matcher import Matcher


def token_allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    """Whether ``bitmask[row]`` allows ``token`` (bit ``token % 32`` of word ``token // 32``)."""
    if token >> 5 >= bitmask.shape[1]:
        return False
    return bool((int(bitmask[row, token >> 5]) >> (token & 31)) & 1)


def allowed_tokens(bitmask: torch.Tensor, row: int, vocab_size: int) -> torch.Tensor:
    """The ids that ``bitmask[row]`` allows, as a 1-D int64 tensor."""
    return torch.from_numpy(np.flatnonzero(allowed_bits(bitmask, row, vocab_size)))


def allowed_bits(bitmask: torch.Tensor, row: int, vocab_size: int) -> np.ndarray:
    """``bitmask[row]`` as one bool per token id below ``vocab_size``."""
    bits = np.unpackbits(bitmask[row].numpy().view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


def mask_accept_disagreements(
    m: Matcher, allowed: np.ndarray, tokens: list[int]
) -> list[tuple[int, bool]]:
    """The tokens of ``tokens`` on which ``m``'s mask (``allowed``: one bool per token id, as
    the caller filled it in ``m``'s present state) and ``m.accept`` disagree, each with the
    mask's verdict. An accepted token is rolled back, so ``m`` is left as it was. The two must
    agree token for token: generation follows the mask, while forced text (jump-forward,
    budget closing, drafts) is verified with ``accept``."""
    out = []
    for t in tokens:
        taken = m.accept(t)
        if taken:
            m.rollback(1)
        if taken != bool(allowed[t]):
            out.append((t, bool(allowed[t])))
    return out


def accepts(
    m: Matcher,
    token_ids: list[int],
    bitmask: torch.Tensor,
    mask_times_us: list[float] | None = None,
) -> bool:
    """True when the mask allows every token in turn, the matcher accepts it, and the matcher
    may end right after the last one. ``mask_times_us`` collects each mask's fill time."""
    for t in token_ids:
        t0 = time.perf_counter()
        m.fill_mask(bitmask, 0)
        if mask_times_us is not None:
            mask_times_us.append((time.perf_counter() - t0) * 1e6)
        if not token_allowed(bitmask, 0, t) or not m.accept(t):
            return False
    return m.can_terminate()


def random_walk(
    m: Matcher,
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
    rng: random.Random,
    *,
    max_tokens: int = 256,
    end_bias: float = 0.3,
) -> list[int] | None:
    """Pick random allowed tokens until the matcher terminates; None if it runs past max_tokens.

    Once the text may end, an EOS is taken with probability ``end_bias`` so walks stay short.
    Returns the tokens accepted, without the final EOS.
    """
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    out: list[int] = []
    eos = set(eos_token_ids)
    for _ in range(max_tokens):
        if m.is_terminated():
            return out
        m.fill_mask(bitmask, 0)
        choices = allowed_tokens(bitmask, 0, vocab_size).tolist()
        if not choices:
            raise AssertionError("the matcher allows no token but has not terminated")
        ends = [t for t in choices if t in eos]
        if ends and (rng.random() < end_bias or len(ends) == len(choices)):
            token = rng.choice(ends)
        else:
            token = rng.choice([t for t in choices if t not in eos])
        if not m.accept(token):
            raise AssertionError(f"the matcher refused token {token} that its own mask allowed")
        if token in eos:
            return out
        out.append(token)
    return None


def check_instances(
    new_matcher,
    instances: list[tuple[object, bool]],
    encode,
    bitmask: torch.Tensor,
    mask_times_us: list[float] | None = None,
) -> tuple[int, int]:
    """Run ``(data, valid)`` pairs through fresh matchers, each instance laid out by ``json.dumps``
    with its default separators; returns (false accepts, false rejects)."""
    import json

    false_accept = false_reject = 0
    for data, valid in instances:
        ids = encode(json.dumps(data, ensure_ascii=False))
        ok = accepts(new_matcher(), ids, bitmask, mask_times_us)
        false_reject += valid and not ok
        false_accept += (not valid) and ok
    return false_accept, false_reject
