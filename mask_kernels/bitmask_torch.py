"""The torch implementation of ``apply_bitmask_``: the CPU path (any device works, CUDA uses Triton).

``masked_fill_`` and ``torch.where`` with a bool mask run at about 2 ns per element on the CPU, ten
times slower than a plain int op, so the mask is applied to the logits' *bit patterns* instead:

    keep = (word << (31 - bit)) >> 31      # arithmetic shift: -1 where allowed, 0 where not
    bits = (bits & keep) | (~keep & NEG_INF_BITS)

Every step is a contiguous, vectorised integer op. Disallowed entries become exactly -inf;
allowed entries keep their exact bits (NaN and -0.0 included). Rows are processed in chunks so
the int32 temporaries stay around 4 MiB (cache-sized), whatever B and V are.
"""

from __future__ import annotations

import torch

_CHUNK_ELEMENTS = 1 << 20

# The bit pattern of -inf, as the signed integer of the same width as the float.
_NEG_INF_BITS = {
    torch.float32: (torch.int32, -8388608),  # 0xFF800000
    torch.bfloat16: (torch.int16, -128),  # 0xFF80
    torch.float16: (torch.int16, -1024),  # 0xFC00
}

_shift_tables: dict[tuple[int, torch.device], torch.Tensor] = {}


def _shift_table(words: int, device: torch.device) -> torch.Tensor:
    """int32[1, 32 * words]: 31 - (token % 32), so that << moves token's bit to the sign bit."""
    key = (words, device)
    table = _shift_tables.get(key)
    if table is None:
        table = (31 - torch.arange(32, dtype=torch.int32, device=device)).repeat(words)
        table = table.view(1, 32 * words)
        if len(_shift_tables) > 16:
            _shift_tables.clear()
        _shift_tables[key] = table
    return table


def keep_masks(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """int32[R, width] of -1 (allowed) / 0 (disallowed) for ``R`` bitmask rows, ``width <= 32*W``."""
    words = bitmask.shape[1]
    keep = bitmask.repeat_interleave(32, dim=1)
    keep <<= _shift_table(words, bitmask.device)
    keep >>= 31
    return keep[:, :width]


def _apply_keep(bits: torch.Tensor, keep: torch.Tensor, neg_inf: int) -> None:
    """In place on the integer view of logits rows: allowed bits stay, disallowed become -inf."""
    if bits.dtype != keep.dtype:
        keep = keep.to(bits.dtype)
    bits &= keep
    bits |= keep.bitwise_not_().bitwise_and_(neg_inf)


def apply_bitmask_torch_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """Same contract as :func:`corral.mask_kernels.apply_bitmask_`; arguments already checked."""
    int_dtype, neg_inf = _NEG_INF_BITS[logits.dtype]
    bits = logits.view(int_dtype)
    vocab = logits.shape[1]
    covered = min(vocab, 32 * bitmask.shape[1])
    if rows is None:
        if covered < vocab:
            bits[: bitmask.shape[0], covered:] = neg_inf
        step = max(1, _CHUNK_ELEMENTS // max(covered, 1))
        for start in range(0, bitmask.shape[0], step):
            keep = keep_masks(bitmask[start : start + step], covered)
            _apply_keep(bits[start : start + step, :covered], keep, neg_inf)
        return
    # A mixed batch: one bitmask row at a time, so repeated rows intersect their masks exactly
    # as the GPU kernel does (both write -inf, never restore a value).
    for i, row in enumerate(rows.tolist()):
        if covered < vocab:
            bits[row, covered:] = neg_inf
        keep = keep_masks(bitmask[i : i + 1], covered)
        _apply_keep(bits[row : row + 1, :covered], keep, neg_inf)
