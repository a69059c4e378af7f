"""Counter-based randomness: the draw for (seed, offset, token) is a pure function of the three.

Nothing here has state, so a row's noise does not depend on the batch it sits in, on the device,
or on how the vocabulary is split among GPU programs. The recipe, bit for bit (all arithmetic on
unsigned 32-bit words, i.e. modulo 2**32):

    mix(x)   = x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x5BD1E995; x ^= x >> 16
    key_a    = mix(mix(mix(mix(seed_lo ^ 0x2545F491) ^ seed_hi) ^ offset_lo) ^ offset_hi)
    key_b    = mix(key_a ^ 0x68E31DA4)
    h(token) = mix(mix(token + key_a) ^ key_b)
    u        = (2 * (h >> 9) + 1) / 2**24          # exact in float32, strictly inside (0, 1)
    gumbel   = -log(-log(u))                        # float32

Both multipliers are below 2**31, so the torch version can run in int64 (the product of a 32-bit
word and a multiplier never overflows) while the Triton version runs natively in uint32.
"""

from __future__ import annotations

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
MUL1 = 0x7FEB352D
MUL2 = 0x5BD1E995
SEED_SALT = 0x2545F491
KEY_B_SALT = 0x68E31DA4
U_SCALE = 2.0**-24


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit integer mix on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * MUL1) & MASK32
    x = x ^ (x >> 15)
    x = (x * MUL2) & MASK32
    return x ^ (x >> 16)


def row_keys(seed: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_a, key_b) per row as int64 in [0, 2**32), on the device of ``seed``; no host sync."""
    seed = seed.to(torch.int64)
    offset = offset.to(seed.device, torch.int64)
    lo_s, hi_s = seed & MASK32, (seed >> 32) & MASK32
    lo_o, hi_o = offset & MASK32, (offset >> 32) & MASK32
    key_a = mix32(mix32(mix32(mix32(lo_s ^ SEED_SALT) ^ hi_s) ^ lo_o) ^ hi_o)
    return key_a, mix32(key_a ^ KEY_B_SALT)


def token_hash(key_a: torch.Tensor, key_b: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """h(token) for every (row, token) pair: keys are [B], tokens [V]; the result is int64[B, V]."""
    x = (tokens.to(torch.int64).unsqueeze(0) + key_a.unsqueeze(1)) & MASK32
    return mix32(mix32(x) ^ key_b.unsqueeze(1))


def uniform_from_hash(h: torch.Tensor) -> torch.Tensor:
    """u in (0, 1) as float32; every step is exact, so any implementation gets the same bits."""
    return ((h >> 9).to(torch.float32) * 2.0 + 1.0) * U_SCALE


def _mix32_numpy_(x: np.ndarray) -> np.ndarray:
    """mix32 in place on uint32 (numpy wraps natively; far fewer passes than int64 torch ops)."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(MUL1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(MUL2)
    x ^= x >> np.uint32(16)
    return x


def _gumbel_noise_cpu(key_a: torch.Tensor, key_b: torch.Tensor, vocab: int) -> torch.Tensor:
    h = np.arange(vocab, dtype=np.uint32)[None, :] + key_a.numpy().astype(np.uint32)[:, None]
    h = _mix32_numpy_(h)
    h ^= key_b.numpy().astype(np.uint32)[:, None]
    h = _mix32_numpy_(h)
    h >>= np.uint32(9)
    u = h.astype(np.float32)
    u *= np.float32(2.0)
    u += np.float32(1.0)
    u *= np.float32(U_SCALE)
    np.negative(np.log(np.negative(np.log(u, out=u), out=u), out=u), out=u)
    return torch.from_numpy(u)


def gumbel_noise(key_a: torch.Tensor, key_b: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32[B, vocab] of standard Gumbel draws, one per (row, token)."""
    if key_a.device.type == "cpu":
        return _gumbel_noise_cpu(key_a, key_b, vocab)
    tokens = torch.arange(vocab, device=key_a.device)
    u = uniform_from_hash(token_hash(key_a, key_b, tokens))
    return u.log_().neg_().log_().neg_()
