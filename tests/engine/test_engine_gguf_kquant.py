"""Q6_K and Q5_K kept quantized on the CPU (`quant.KQuantWeight`, the `cpu_kquant` C kernel),
judged against gguf's own dequantization.

Bounds. The unpacked weights are gguf's dequantized values bit for bit (every product of the
formula is exact in float32). The kernel quantizes the activations per group of 16 into two int8
parts (about 15 bits) and writes bfloat16, so each output is within `REL` of the float32
reference's magnitude plus `ABS_SHARE` of the sum of |x| |W| over its dot product (the size of
the activation rounding): 2^-8 covers bfloat16's half-step, 2^-12 the activation parts' 2^-15
with room (measured on `test_kernel_matches_the_dequantized_matmul`'s cases: the error is at
most 5.6e-4 of that sum, and beyond bfloat16's half-step at most 2.5e-6 of it).

The tiny models' logits: the KL divergence from the float32 reference is at most `TINY_KL_MAX`
plus twice that of the same file run dense in bfloat16 (the rounding floor of bfloat16
activations on that model: the Q4_K_M-like random model is badly conditioned, 0.047 dense in
bfloat16 and 0.080 quantized; the Q5_K one 9e-4 and 6e-5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from gguf_factory import q4_k_m, random_blocks, write_random_llama_gguf
from test_engine_gguf_quantized import (
    TINY_KL_MAX,
    all_row_logits,
    assert_top1_agrees_outside_ties,
    kl_rows,
)

from corral.engine.kernels.cpu_kernels import KernelError
from corral.engine.kernels.cpu_kquant import kquant_kernel
from corral.engine.kernels.quant import (
    Int4Weight,
    KQuantWeight,
    RowStack,
    kquant_from_gguf,
    kquant_linear,
)
from corral.engine.loading.assets import default_gguf_path, load_model
from corral.engine.loading.gguf_weights import RefinedHead

REL, ABS_SHARE = 2.0**-8, 2.0**-12
KTYPES = [QT.Q6_K, QT.Q5_K]
needs_kernel = pytest.mark.skipif(kquant_kernel() is None, reason="the CPU lacks AVX512-VNNI")


def blocks(qtype: QT, n: int, k: int, seed: int = 0) -> np.ndarray:
    return random_blocks(qtype, n, k, np.random.default_rng(seed), k**-0.5)


@pytest.mark.parametrize("qtype", KTYPES)
def test_unpacked_weights_are_ggufs_dequantization_bit_for_bit(qtype):
    raw = blocks(qtype, 128, 512)
    w = kquant_from_gguf(raw, qtype)
    want = torch.from_numpy(dequantize(raw, qtype))
    assert w.shape == (128, 512)
    assert torch.equal(w.dequantized(), want)


@needs_kernel
@pytest.mark.parametrize("qtype", KTYPES)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_kernel_matches_the_dequantized_matmul(qtype, m):
    n, k = 192, 768
    raw = blocks(qtype, n, k, seed=m)
    w = kquant_from_gguf(raw, qtype)
    dense = torch.from_numpy(dequantize(raw, qtype))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
    got = kquant_kernel().matmul(x, w).float()
    want = x.float() @ dense.T
    size = x.float().abs() @ dense.abs().T
    err = (got - want).abs()
    assert (err <= REL * want.abs() + ABS_SHARE * size).all(), (err / size).max()
    # through the Linear signature, with a bias, in float32
    b = torch.randn(n)
    y = kquant_linear(x.float(), w, b)
    assert y.dtype == torch.float32
    assert torch.allclose(y, got + b, atol=1e-2, rtol=0)


@needs_kernel
def test_kernel_refuses_what_it_cannot_run():
    w = kquant_from_gguf(blocks(QT.Q6_K, 64, 256), QT.Q6_K)
    kernel = kquant_kernel()
    with pytest.raises(ValueError, match="bfloat16"):
        kernel.matmul(torch.zeros(1, 256), w)
    with pytest.raises(ValueError, match="bfloat16"):
        kernel.matmul(torch.zeros(1, 512, dtype=torch.bfloat16), w)
    assert kernel.matmul(torch.zeros(0, 256, dtype=torch.bfloat16), w).shape == (0, 64)
    bad = KQuantWeight(w.u, w.sc, w.d.double(), None, None, 32, 64, 256)
    with pytest.raises(ValueError, match="float32"):
        kernel.matmul(torch.zeros(1, 256, dtype=torch.bfloat16), bad)
    assert issubclass(KernelError, RuntimeError)


def test_shapes_off_the_grid_are_refused_at_packing():
    with pytest.raises(ValueError, match="% 64"):
        kquant_from_gguf(blocks(QT.Q6_K, 48, 256), QT.Q6_K)
    with pytest.raises(ValueError, match="not one of"):
        kquant_from_gguf(blocks(QT.Q4_K, 64, 256), QT.Q4_K)


def test_without_the_kernel_the_matmul_is_the_dequantized_one(monkeypatch):
    raw = blocks(QT.Q5_K, 64, 256)
    w = kquant_from_gguf(raw, QT.Q5_K)
    monkeypatch.setenv("CORRAL_CPU_KERNELS", "0")
    x = torch.randn(2, 256)
    want = x @ torch.from_numpy(dequantize(raw, QT.Q5_K)).T
    assert torch.allclose(kquant_linear(x, w, None), want, atol=1e-5, rtol=1e-5)


def test_a_q6_k_weight_takes_about_half_of_bfloat16s_memory():
    w = kquant_from_gguf(blocks(QT.Q6_K, 256, 2048), QT.Q6_K)
    q5 = kquant_from_gguf(blocks(QT.Q5_K, 256, 2048), QT.Q5_K)
    bf16 = 256 * 2048 * 2
    assert w.nbytes / bf16 < 8.7 / 16 and q5.nbytes / bf16 < 9.3 / 16, (w.nbytes, q5.nbytes)


@needs_kernel
@pytest.mark.parametrize("kind", ["q4_k_m", "q5_k"])
def test_a_tiny_k_quant_model_keeps_its_q6_k_and_q5_k_tensors_quantized(kind, tmp_path):
    qtype = q4_k_m if kind == "q4_k_m" else QT.Q5_K
    path = write_random_llama_gguf(default_gguf_path(), tmp_path / f"tiny-{kind}.gguf", qtype)
    ref = load_model(str(path), cache_dir=tmp_path, quantize="none")
    ours = load_model(str(path), cache_dir=tmp_path, quantize="gguf")
    bf16 = load_model(str(path), cache_dir=tmp_path, quantize="none", dtype=torch.bfloat16)
    model = ours.runner.model
    if kind == "q4_k_m":  # Q and K in Q4_K, V in Q6_K; layer 0's down in Q6_K; untied Q6_K head
        qkv = model.layers[0].qkv_weight
        assert isinstance(qkv, RowStack)
        assert [type(p) for p in qkv.parts] == [Int4Weight, KQuantWeight]
        assert isinstance(model.layers[0].down_weight, KQuantWeight)
        assert isinstance(model.layers[1].down_weight, Int4Weight)
        assert isinstance(model.lm_head, RefinedHead)
        assert isinstance(model.lm_head.weight, KQuantWeight)
    else:
        for name in model.layers[0].MATMUL_WEIGHTS:
            assert isinstance(getattr(model.layers[0], name), KQuantWeight), name
    prompts = [ref.tokenizer(t)["input_ids"] for t in ("Hello there, friend.", "1, 2, 3, 4")]
    want, got = all_row_logits(ref, prompts), all_row_logits(ours, prompts)
    floor = kl_rows(want, all_row_logits(bf16, prompts)).max().item()
    assert kl_rows(want, got).max().item() <= TINY_KL_MAX + 2 * floor
    assert_top1_agrees_outside_ties(want, got)
