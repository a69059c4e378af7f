"""Triton kernels: apply a packed bitmask in place, and the fused mask + Gumbel-max sampling pass.

Imported only for CUDA tensors (or under ``TRITON_INTERPRET=1``, where the same kernels run on
CPU tensors, which is how the tests check them without a GPU). Nothing here synchronises with the
host: shapes and host-side hints decide the launch, never tensor values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MASK_BLOCK = 4096
_SAMPLE_BLOCK = 1024
_INT32_MAX = 2**31 - 1


@triton.jit
def _bitmask_kernel(
    logits_ptr,
    logits_stride,
    bitmask_ptr,
    bitmask_stride,
    rows_ptr,
    vocab,
    words,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per (bitmask row, BLOCK tokens). Logits are never read: disallowed tokens get a
    # masked store of -inf, allowed ones are left alone.
    mask_row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    if HAS_ROWS:
        row = tl.load(rows_ptr + mask_row).to(tl.int64)
    else:
        row = mask_row.to(tl.int64)
    word_idx = start // 32 + tl.arange(0, BLOCK // 32)
    packed = tl.load(
        bitmask_ptr + mask_row.to(tl.int64) * bitmask_stride + word_idx,
        mask=word_idx < words,
        other=0,
    )
    bits = (packed[:, None] >> tl.arange(0, 32)[None, :]) & 1
    disallowed = tl.reshape(bits == 0, [BLOCK])
    offs = start + tl.arange(0, BLOCK)
    tl.store(
        logits_ptr + row * logits_stride + offs,
        tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty),
        mask=disallowed & (offs < vocab),
    )


def apply_bitmask_triton_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """Same contract as :func:`corral.mask_kernels.apply_bitmask_`; arguments already checked."""
    vocab = logits.shape[1]
    n = bitmask.shape[0] if rows is None else rows.shape[0]
    if n == 0 or vocab == 0:
        return
    grid = (n, triton.cdiv(vocab, _MASK_BLOCK))
    _bitmask_kernel[grid](
        logits,
        logits.stride(0),
        bitmask,
        bitmask.stride(0),
        rows if rows is not None else bitmask,
        vocab,
        bitmask.shape[1],
        HAS_ROWS=rows is not None,
        BLOCK=_MASK_BLOCK,
        num_warps=8,
    )


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x5BD1E995
    return x ^ (x >> 16)


@triton.jit
def _sample_kernel(
    logits_ptr,
    logits_stride,
    bitmask_ptr,
    bitmask_stride,
    words,
    mask_row_ptr,
    thr_ptr,
    inv_t_ptr,
    greedy_ptr,
    key_a_ptr,
    key_b_ptr,
    out_max_ptr,
    out_sum_ptr,
    out_score_ptr,
    out_index_ptr,
    vocab,
    chunk,
    n_chunks,
    HAS_MASK: tl.constexpr,
    HAS_THR: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per (row, chunk of the vocabulary): a single read of the logits computes the
    # online max / sum-exp (for the logprob) and the Gumbel-max race among allowed survivors.
    row = tl.program_id(0)
    part = tl.program_id(1)
    start = part * chunk
    end = tl.minimum(start + chunk, vocab)
    row64 = row.to(tl.int64)
    mask_row = -1
    if HAS_MASK:
        mask_row = tl.load(mask_row_ptr + row)
    thr = float("-inf")
    if HAS_THR:
        thr = tl.load(thr_ptr + row)
    inv_t = tl.load(inv_t_ptr + row)
    greedy = tl.load(greedy_ptr + row) != 0
    key_a = tl.load(key_a_ptr + row).to(tl.uint32)
    key_b = tl.load(key_b_ptr + row).to(tl.uint32)

    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_at = tl.full([BLOCK], 2147483647, tl.int32)
    for base in tl.range(start, end, BLOCK):
        offs = base + tl.arange(0, BLOCK)
        live = offs < end
        x = tl.load(logits_ptr + row64 * logits_stride + offs, mask=live, other=float("-inf"))
        x = x.to(tl.float32)
        if mask_row >= 0:
            word_idx = base // 32 + tl.arange(0, BLOCK // 32)
            packed = tl.load(
                bitmask_ptr + mask_row.to(tl.int64) * bitmask_stride + word_idx,
                mask=word_idx < words,
                other=0,
            )
            bits = tl.reshape((packed[:, None] >> tl.arange(0, 32)[None, :]) & 1, [BLOCK])
            x = tl.where(bits != 0, x, float("-inf"))
        new_max = tl.maximum(run_max, x)
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(x - safe)
        run_max = new_max
        if greedy:
            score = x
        else:
            h = _mix32(_mix32(offs.to(tl.uint32) + key_a) ^ key_b)
            u = ((h >> 9).to(tl.float32) * 2.0 + 1.0) * 5.9604644775390625e-08
            score = x * inv_t - tl.log(-tl.log(u))
        if HAS_THR:
            score = tl.where(x >= thr, score, float("-inf"))
        take = score > best
        best = tl.where(take, score, best)
        best_at = tl.where(take, offs, best_at)

    row_max = tl.max(run_max, axis=0)
    safe_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(run_sum * tl.exp(run_max - safe_max), axis=0)
    top = tl.max(best, axis=0)
    top_at = tl.min(tl.where(best == top, best_at, 2147483647), axis=0)
    slot = row64 * n_chunks + part
    tl.store(out_max_ptr + slot, row_max)
    tl.store(out_sum_ptr + slot, total)
    tl.store(out_score_ptr + slot, top)
    tl.store(out_index_ptr + slot, top_at)


def _programs_per_row(rows: int, vocab: int, device: torch.device) -> int:
    """Split a row across programs only when the batch alone cannot fill the GPU."""
    if device.type == "cuda":
        target = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    else:  # the interpreter: a couple of chunks, so the cross-chunk combine is exercised
        target = 2 * rows
    return max(1, min(triton.cdiv(target, max(rows, 1)), triton.cdiv(vocab, _SAMPLE_BLOCK)))


def sample_partials_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    mask_row: torch.Tensor | None,
    thr: torch.Tensor | None,
    inv_t: torch.Tensor,
    greedy: torch.Tensor,
    key_a: torch.Tensor,
    key_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (row, chunk): masked max, sum of exp(x - max), best Gumbel score and its token id.

    ``mask_row[r]`` is the bitmask row constraining logits row r, or -1 (unconstrained).
    Returns four [B, chunks] tensors; :func:`combine_partials` reduces them.
    """
    rows, vocab = logits.shape
    chunks = _programs_per_row(rows, vocab, logits.device)
    chunk = triton.cdiv(triton.cdiv(vocab, chunks), _SAMPLE_BLOCK) * _SAMPLE_BLOCK
    chunks = triton.cdiv(vocab, chunk)
    out = dict(device=logits.device)
    part_max = torch.empty((rows, chunks), dtype=torch.float32, **out)
    part_sum = torch.empty((rows, chunks), dtype=torch.float32, **out)
    part_score = torch.empty((rows, chunks), dtype=torch.float32, **out)
    part_index = torch.empty((rows, chunks), dtype=torch.int32, **out)
    has_mask = bitmask is not None and mask_row is not None
    _sample_kernel[(rows, chunks)](
        logits,
        logits.stride(0),
        bitmask if has_mask else logits,
        bitmask.stride(0) if has_mask else 0,
        bitmask.shape[1] if has_mask else 0,
        mask_row if has_mask else inv_t,
        thr if thr is not None else inv_t,
        inv_t,
        greedy,
        key_a,
        key_b,
        part_max,
        part_sum,
        part_score,
        part_index,
        vocab,
        chunk,
        chunks,
        HAS_MASK=has_mask,
        HAS_THR=thr is not None,
        BLOCK=_SAMPLE_BLOCK,
        num_warps=4,
    )
    return part_max, part_sum, part_score, part_index


def combine_partials(
    part_max: torch.Tensor,
    part_sum: torch.Tensor,
    part_score: torch.Tensor,
    part_index: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(best score, best token as int64, logsumexp) per row; ties go to the lowest token id."""
    row_max = part_max.amax(dim=1)
    safe = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    total = (part_sum * torch.exp(part_max - safe.unsqueeze(1))).sum(dim=1)
    lse = safe + torch.log(total)
    # argmax returns the first maximum, i.e. the lowest chunk, which holds the lowest token ids.
    winner = part_score.argmax(dim=1, keepdim=True)
    best = part_score.gather(1, winner).squeeze(1)
    index = part_index.gather(1, winner).squeeze(1).to(torch.int64)
    return best, index, lse
