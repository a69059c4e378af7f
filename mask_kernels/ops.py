"""The public operations: argument checks, then the Triton path (CUDA) or the torch path (CPU)."""

from __future__ import annotations

import torch

from .bitmask_torch import apply_bitmask_torch_
from .params import SampleResult, SamplingTensors
from .rng import row_keys
from .sampling_torch import finish, greedy_and_inverse_temperature, row_threshold, sample_torch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    # Shape, dtype and device checks only: bounds of `rows` would need the values (a host sync).
    if logits.dim() != 2 or logits.dtype not in _FLOATS:
        raise ValueError(
            f"logits must be a 2-D float32/bfloat16/float16 tensor [B, V], got "
            f"{logits.dtype} of shape {tuple(logits.shape)}"
        )
    if logits.numel() > 0 and logits.shape[1] > 1 and logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary (call .contiguous())")
    if (
        bitmask.dtype != torch.int32
        or bitmask.dim() != 2
        or (bitmask.numel() > 0 and bitmask.shape[1] > 1 and bitmask.stride(1) != 1)
    ):
        raise ValueError(
            f"bitmask must be a 2-D int32 tensor [B', ceil(V/32)] contiguous along its words, "
            f"got {bitmask.dtype} of shape {tuple(bitmask.shape)}"
        )
    if bitmask.device != logits.device:
        raise ValueError(
            f"bitmask is on {bitmask.device} but logits are on {logits.device}; copy the bitmask "
            f"over first (bitmask.to(logits.device, non_blocking=True) from pinned memory)"
        )
    if rows is None:
        if bitmask.shape[0] > logits.shape[0]:
            raise ValueError(
                f"bitmask has {bitmask.shape[0]} rows for {logits.shape[0]} logits rows; "
                f"pass rows= to say which logits row each bitmask row constrains"
            )
        return
    if rows.dim() != 1 or rows.shape[0] != bitmask.shape[0] or rows.dtype.is_floating_point:
        raise ValueError(
            f"rows must be a 1-D integer tensor with one entry per bitmask row "
            f"({bitmask.shape[0]}), got {rows.dtype} of shape {tuple(rows.shape)}"
        )
    if rows.device != logits.device:
        raise ValueError(f"rows is on {rows.device} but logits are on {logits.device}")


def apply_bitmask_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """Set every disallowed logit to -inf, in place.

    ``logits``: float32/bfloat16/float16 ``[B, V]``. ``bitmask``: int32 ``[B', W]``; bit ``i`` of
    word ``j`` allows token ``32*j + i``; tokens ``>= 32*W`` (model vocabulary padding beyond the
    tokenizer's) are disallowed. ``rows[i]`` is the logits row that bitmask row ``i`` constrains
    (``None``: row ``i``); unlisted rows are untouched. Allowed logits keep their exact bits.
    A repeated entry in ``rows`` applies both masks (their intersection).
    """
    _check(logits, bitmask, rows)
    if logits.device.type == "cuda":
        from .triton_kernels import apply_bitmask_triton_

        apply_bitmask_triton_(logits, bitmask, rows)
    else:
        apply_bitmask_torch_(logits, bitmask, rows)


def _mask_rows(batch: int, bitmask: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """int32[B]: the bitmask row constraining each logits row, or -1; built without a host sync."""
    if rows is None:
        index = torch.arange(batch, dtype=torch.int32, device=bitmask.device)
        return torch.where(index < bitmask.shape[0], index, -1)
    mask_row = torch.full((batch,), -1, dtype=torch.int32, device=bitmask.device)
    source = torch.arange(rows.shape[0], dtype=torch.int32, device=bitmask.device)
    return mask_row.scatter_(0, rows.to(torch.int64), source)


def sample_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    params: SamplingTensors,
    rows: torch.Tensor | None = None,
) -> SampleResult:
    """The Triton path of :func:`sample`, unchecked (CUDA, or CPU under ``TRITON_INTERPRET=1``)."""
    from .triton_kernels import apply_bitmask_triton_, combine_partials, sample_partials_triton

    greedy, inv_t = greedy_and_inverse_temperature(params)
    greedy = greedy.to(torch.int32)
    key_a, key_b = row_keys(params.seed, params.offset)
    mask_row = None if bitmask is None else _mask_rows(logits.shape[0], bitmask, rows)
    thr = None
    if params.uses_top_k_or_top_p and not params.all_greedy:
        # The sort needs masked logits anyway: mask in place once, then the pass reads no mask.
        if bitmask is not None:
            apply_bitmask_triton_(logits, bitmask, rows)
            bitmask = mask_row = None
        thr = row_threshold(logits, None, params)
    elif params.uses_min_p and not params.all_greedy:
        first = sample_partials_triton(logits, bitmask, mask_row, None, inv_t, greedy, key_a, key_b)
        row_max = first[0].amax(dim=1)
        thr = row_threshold(logits, row_max, params)
    parts = sample_partials_triton(logits, bitmask, mask_row, thr, inv_t, greedy, key_a, key_b)
    best, index, lse = combine_partials(*parts)
    return finish(best, index, logits, lse)


def sample(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    params: SamplingTensors,
    rows: torch.Tensor | None = None,
) -> SampleResult:
    """Mask, then draw one token per row: temperature, top-k, top-p, min-p, greedy, seeded.

    Semantics (identical on CPU and CUDA) are in :mod:`corral.mask_kernels.sampling_torch`; the
    noise recipe is in :mod:`corral.mask_kernels.rng`. ``bitmask``/``rows`` are as in
    :func:`apply_bitmask_` (here the entries of ``rows`` must be distinct); ``None`` leaves
    every row unconstrained.

    **May modify ``logits`` in place** (masked rows become -inf where disallowed). No host
    synchronisation on CUDA. Passes over the logits: 1 for greedy/temperature rows (mask, logsumexp
    and the Gumbel race fused); 2 with min-p (a max pass first); with top-k/top-p, the in-place
    mask, one sort, then 1 sampling pass.
    """
    if bitmask is not None:
        _check(logits, bitmask, rows)
    elif logits.dim() != 2 or logits.dtype not in _FLOATS:
        raise ValueError(f"logits must be a 2-D float tensor [B, V], got {tuple(logits.shape)}")
    if params.batch_size != logits.shape[0] or params.temperature.device != logits.device:
        raise ValueError(
            f"params describe {params.batch_size} rows on {params.temperature.device}, logits "
            f"have {logits.shape[0]} on {logits.device}; build one entry per logits row"
        )
    if logits.device.type == "cuda":
        return sample_triton(logits, bitmask, params, rows)
    if bitmask is not None:
        apply_bitmask_torch_(logits, bitmask, rows)
    return sample_torch(logits, params)
