"""The model's matmuls on the CPU: oneDNN, on weights packed once into its blocked layout.

A decode step multiplies a few rows (one per sequence) by every weight matrix, so it costs about
one pass over the weights plus the arithmetic. `F.linear` hands float32 to MKL and bfloat16 to
oneDNN with the weight in plain row-major layout, which oneDNN re-blocks on the fly. Reordering
each weight once ("packing") into the layout oneDNN's kernels read made the model's matmuls
30-40% faster at 8-32 rows and no slower at 1 or ~300 rows on a Zen 4 core, in float32 and
bfloat16. Both paths accumulate in float32; only the summation order differs from `F.linear`.

A packed weight is an opaque `mkldnn` tensor: only `onednn_linear` / `packed_linear` can use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]

PACK_BATCH_HINT = 32
"""Row count oneDNN's layout is chosen for; measured equally good from 8 to 512 rows (1 is not)."""

_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# oneDNN picks a slower kernel for 1-2 rows on packed weights than for 4 (measured, whole model,
# Zen 4: float32 1 row 38 ms vs 4 rows 31 ms; 2 rows 46 ms): pad such inputs to 4 rows.
_MIN_FAST_ROWS, _PAD_ROWS_TO = 3, 4


def onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`x @ w.T + b` through oneDNN; `w` may be dense or from `pack_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def packed_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`onednn_linear` for packed weights, with 1-2 row inputs padded (rows are independent)."""
    rows = x.shape[0]
    if rows >= _MIN_FAST_ROWS:
        return onednn_linear(x, w, b)
    padded = x.new_zeros(_PAD_ROWS_TO, x.shape[1])
    padded[:rows] = x
    return onednn_linear(padded, w, b)[:rows]


def pack_weight(w: torch.Tensor, batch_hint: int = PACK_BATCH_HINT) -> torch.Tensor:
    """A copy of `w` (`[out, in]`) in oneDNN's blocked layout, for `packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), batch_hint)


@functools.cache
def _onednn_works(dtype: torch.dtype, packed: bool) -> bool:
    # Some torch builds lack the ops, and oneDNN may refuse a dtype the CPU cannot do: try once.
    if not torch.backends.mkldnn.is_available():
        return False
    x = torch.arange(6, dtype=dtype).view(2, 3)
    w = torch.arange(12, dtype=dtype).view(4, 3)
    try:
        got = onednn_linear(x, pack_weight(w) if packed else w, None)
    except (RuntimeError, AttributeError):
        return False
    return bool(torch.equal(got, F.linear(x, w)))


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `pack_weight` + `onednn_linear` work for this dtype and device."""
    return device.type == "cpu" and dtype in _PACKABLE_DTYPES and _onednn_works(dtype, True)


def linear_fn(dtype: torch.dtype, device: torch.device) -> Linear:
    """The matmul for dense weights: oneDNN for float32 on the CPU, else `F.linear`.

    With dense weights, oneDNN's float32 GEMM still beats MKL's by 10-20% at decode sizes;
    bfloat16 `F.linear` already goes through oneDNN.
    """
    if device.type == "cpu" and dtype == torch.float32 and _onednn_works(dtype, False):
        return onednn_linear
    return F.linear
