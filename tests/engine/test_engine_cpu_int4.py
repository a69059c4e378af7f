"""The C int4 matmul (`corral.engine.kernels.cpu_int4`) against gguf's dequantized weights and torch's.

The kernel reads torch's packed int4 layout in place and quantizes the activations to two int8
parts per group of 32 (about 15 bits), so its only rounding of note is the bfloat16 output's:
it must be within `RTOL` of the float32 product with gguf's dequantized weights, and no further
from it than torch's bfloat16 kernel (which rounds the activations to 8 bits).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from test_engine_quant import random_blocks, rel_err

from corral.engine.kernels import cpu_int4, cpu_kernels
from corral.engine.kernels.quant import GROUP, int4_from_dense, int4_from_gguf, int4_linear

RTOL = 4e-3  # bfloat16 output rounding (2^-9 relative per element), measured 2.3-2.5e-3
BF16 = torch.bfloat16

pytestmark = pytest.mark.skipif(
    cpu_int4.int4_kernel() is None, reason="the C int4 kernel needs AVX512-VNNI and AVX512-VBMI"
)


def exact_weights(w) -> torch.Tensor:
    """The `[n, k]` float32 matrix a packed weight stands for: (q - 8) * scale + zero with its
    own (bfloat16-valued) scales, through torch's exact float32 path."""
    w32 = replace(w, scales_zeros=w.scales_zeros.float())
    return int4_linear(torch.eye(w.in_features), w32, None).T


def torch_int4(x: torch.Tensor, w) -> torch.Tensor:
    xc = torch.cat((x, x), dim=1) if w.split_input else x
    return torch.ops.aten._weight_int4pack_mm_for_cpu(xc, w.packed, GROUP, w.scales_zeros)


def kernel_int4(x: torch.Tensor, w) -> torch.Tensor:
    xc = torch.cat((x, x), dim=1) if w.split_input else x
    return cpu_int4.int4_kernel().matmul(xc.contiguous(), w.packed, w.scales_zeros)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q8_0])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 64])
def test_kernel_matches_gguf_dequantize(qtype: QT, m: int) -> None:
    rows, cols = 192, 512  # three 64-row blocks of the packed layout
    blocks = random_blocks(qtype, rows, cols, seed=m)
    want_w = torch.from_numpy(dequantize(blocks, qtype).reshape(rows, cols))
    w = int4_from_gguf(blocks, qtype, BF16)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m)).to(BF16)
    want = x.float() @ want_w.T
    got = kernel_int4(x, w)
    assert got.dtype == BF16 and got.shape == (m, rows)
    assert rel_err(got, want) < RTOL
    assert rel_err(got, want) <= 1.05 * rel_err(torch_int4(x, w), want)


def test_activations_with_outliers_zero_groups_and_signs() -> None:
    """A group of zeros (scale 0), a lone outlier per group, constant groups, negative rows: the
    residual int8 part keeps the small values the first part rounds away."""
    n, k = 128, 256
    wd = torch.randn(n, k) * 0.02
    w = int4_from_dense(wd)
    x = torch.randn(4, k) * 1e-3
    x[0, :32] = 0
    x[1, 5::32] = 50.0  # one outlier in every group
    x[2] = -7.25
    x[3, ::2] *= -1e4
    x = x.to(BF16)
    want = x.float() @ exact_weights(w).T
    got = kernel_int4(x, w).float()
    assert torch.isfinite(got).all()
    assert torch.equal(got[0] == 0, want[0] == 0) or rel_err(got[0], want[0]) < RTOL
    for r in range(1, 4):
        assert rel_err(got[r], want[r]) < RTOL, r


def test_threads_do_not_change_the_result() -> None:
    w = int4_from_dense(torch.randn(1024, 1536) * 0.05)
    x = torch.randn(8, 1536).to(BF16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel_int4(x, w)
        torch.set_num_threads(2)
        two = kernel_int4(x, w)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_int4_linear_uses_the_kernel_on_its_grid_and_torch_off_it(monkeypatch) -> None:
    on_grid = int4_from_dense(torch.randn(128, 96) * 0.05)
    off_grid = int4_from_dense(torch.randn(80, 96) * 0.05)  # 80 rows: not a multiple of 64
    x = torch.randn(3, 96).to(BF16)
    assert torch.equal(int4_linear(x, on_grid, None), kernel_int4(x, on_grid))
    assert torch.equal(int4_linear(x, off_grid, None), torch_int4(x, off_grid))
    monkeypatch.setenv(cpu_kernels.SWITCH_ENV, "0")
    assert torch.equal(int4_linear(x, on_grid, None), torch_int4(x, on_grid))


def test_refuses_what_it_cannot_take() -> None:
    kernel = cpu_int4.int4_kernel()
    w = int4_from_dense(torch.randn(64, 64))
    with pytest.raises(ValueError):
        kernel.matmul(torch.randn(2, 64), w.packed, w.scales_zeros)  # float32 activations
    with pytest.raises(ValueError):
        kernel.matmul(torch.randn(64, 2).to(BF16).T, w.packed, w.scales_zeros)  # not contiguous
    with pytest.raises(ValueError):
        kernel.matmul(torch.randn(2, 64).to(BF16), w.packed[:, :16], w.scales_zeros)
    with pytest.raises(ValueError):
        kernel.matmul(torch.randn(2, 64).to(BF16), w.packed, w.scales_zeros.float())
    assert not kernel.fits(80, 64) and not kernel.fits(64, 48) and kernel.fits(128, 96)


def test_random_shapes_agree_with_torch_within_its_own_error() -> None:
    rng = np.random.default_rng(1)
    for _ in range(8):
        n, k, m = (
            64 * int(rng.integers(1, 6)),
            32 * int(rng.integers(1, 12)),
            int(rng.integers(1, 9)),
        )
        wd = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)) * 0.05
        w = int4_from_dense(wd)
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(BF16)
        want = x.float() @ exact_weights(w).T
        assert rel_err(kernel_int4(x, w), want) < RTOL, (n, k, m)
