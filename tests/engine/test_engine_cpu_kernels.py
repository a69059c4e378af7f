"""The C kernels of the bfloat16 CPU decode step (`corral.engine.kernels.cpu_kernels`) against torch.

Tolerances. RMSNorm (alone or after the residual add) and silu * up compute in float32 and round
where torch rounds, so they must equal torch bit for bit. RoPE rounds once from float32 where
torch rounds three times, so it is judged against the float32 rotation of the same bfloat16
inputs: within half a bfloat16 step (2^-8 relative at most) plus float32 noise. Attention is judged the
same way against a float32 softmax over the same bfloat16 K/V, and against the torch path
(SDPA in bfloat16) within 2e-2 absolute, a few bfloat16 steps of outputs of size ~1.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import chat, make_engine
from test_engine_gguf_quantized import TIE

from corral.engine import SamplingParams
from corral.engine.execution.attention import TorchAttention
from corral.engine.execution.model import apply_rope, rope_cos_sin, rope_inv_freq
from corral.engine.execution.model_config import RopeConfig
from corral.engine.kernels import cpu_int4, cpu_kernels
from corral.engine.kvcache.kv_pool import KVPool
from corral.engine.loading.assets import load_model

BF16 = torch.bfloat16
HALF_STEP = 2.0**-8  # half a bfloat16 step (8 significant bits), relative: one rounding
SDPA_ATOL = 2e-2


@pytest.fixture(scope="module")
def kernels() -> cpu_kernels.CpuKernels:
    lib = cpu_kernels.library()
    assert lib is not None, "the system compiler should build the kernels on this machine"
    return lib


def within_one_rounding(got: torch.Tensor, exact: torch.Tensor) -> bool:
    return bool(((got.float() - exact).abs() <= exact.abs() * HALF_STEP + 1e-6).all())


@pytest.mark.parametrize(("rows", "n"), [(1, 576), (7, 576), (3, 37)])
def test_norms_and_silu_equal_torch_bit_for_bit(kernels, rows, n):
    g = torch.Generator().manual_seed(rows * n)
    x, y = (torch.randn(rows, n, generator=g).mul(3).to(BF16) for _ in range(2))
    w = torch.randn(n, generator=g).to(BF16)
    assert torch.equal(kernels.rms_norm(x, w, 1e-5), F.rms_norm(x, (n,), w, 1e-5))
    stream = y.clone()
    normed = kernels.add_rms_norm_(x, stream, w, 1e-6)
    assert torch.equal(stream, x + y)
    assert torch.equal(normed, F.rms_norm(x + y, (n,), w, 1e-6))
    h = torch.randn(rows, 2 * n, generator=g).mul(4).to(BF16)
    gate, up = h.chunk(2, dim=-1)
    assert torch.equal(kernels.silu_mul(h), F.silu(gate) * up)


def test_rope_in_place_on_strided_rows_is_one_rounding_from_exact(kernels):
    heads, kv_heads, d, t = 9, 3, 64, 5
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).to(BF16)
    positions = torch.tensor([0, 1, 7, 400, 8191])
    cos, sin = rope_cos_sin(positions, rope_inv_freq(RopeConfig(), d), BF16)
    qk = qkv[:, : (heads + kv_heads) * d].view(t, -1, d)
    want_torch = apply_rope(qk, cos, sin)
    exact = qk.float() * cos.float() + qk.float().roll(d // 2, -1) * sin.float()
    v_before = qkv[:, (heads + kv_heads) * d :].clone()
    got = kernels.rope_(qk, cos, sin)
    assert got.data_ptr() == qkv.data_ptr() and within_one_rounding(got, exact)
    assert torch.equal(qkv[:, (heads + kv_heads) * d :], v_before)  # V columns untouched
    assert (got.float() - want_torch.float()).abs().max() <= 2e-2


def test_wrong_tensors_are_refused_before_the_call(kernels):
    x = torch.randn(2, 8, dtype=BF16)
    with pytest.raises(ValueError, match="bfloat16"):
        kernels.rms_norm(x.float(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.rms_norm(x.t(), torch.ones(2, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.rms_norm(x, torch.ones(7, dtype=BF16), 1e-5)


def reference_attention(q, k_buf, v_buf, kvs, scale, group):
    """float32 softmax attention of each row of `q` `[B, H, D]` over its slots."""
    outs = []
    for qi, slots in zip(q.float(), kvs, strict=True):
        keys = k_buf[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
        values = v_buf[slots].float().repeat_interleave(group, dim=1)
        p = torch.einsum("hd,lhd->hl", qi, keys).mul(scale).softmax(-1)
        outs.append(torch.einsum("hl,lhd->hd", p, values).reshape(-1))
    return torch.stack(outs)


def attention_step(monkeypatch, on: bool, heads, kv_heads, d, lens, span_len, seed):
    """One step of `TorchAttention` (kernel on or off): a decode row per entry of `lens` (its
    total KV length), plus one extending sequence of `span_len` new tokens if > 0, in a pool of
    random K/V with shuffled, partly shared slots. (output, pool, inputs)."""
    monkeypatch.setenv(cpu_kernels.SWITCH_ENV, "1" if on else "0")
    g = torch.Generator().manual_seed(seed)
    pool = KVPool(1, kv_heads, d, 2 + max(lens) + sum(lens) + 2 * span_len, BF16)
    pool.k_buffers[0].copy_(torch.randn(pool.k_buffers[0].shape, generator=g))
    pool.v_buffers[0].copy_(torch.randn(pool.v_buffers[0].shape, generator=g))
    slots = torch.randperm(pool.num_slots - 1, generator=g) + 1
    shared, fresh = slots[: max(lens)], slots[max(lens) :]
    kvs, extend, used = [], [], 0
    for n in lens:  # every sequence shares a prefix with the longest one, then its new slot
        kvs.append(torch.cat((shared[: n - 1], fresh[used : used + 1])))
        extend.append(1)
        used += 1
    if span_len:  # an extending sequence in the middle of the batch
        kvs.insert(1, torch.cat((shared[:3], fresh[used : used + span_len])))
        extend.insert(1, span_len)
    t = sum(extend)
    out_slots = torch.cat([kv[-e:] for kv, e in zip(kvs, extend, strict=True)])
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).to(BF16)
    q = qkv[:, : heads * d].view(t, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    attn = TorchAttention(heads, kv_heads, d, d**-0.5)
    meta = attn.prepare(out_slots, kvs, extend, torch.device("cpu"), BF16)
    assert (meta.decode.kernels is not None) == on
    out = attn.forward(q, k, v, 0, pool, meta)
    decode_rows = [i for i, e in enumerate(extend) if e == 1]
    starts = torch.tensor([0, *extend]).cumsum(0)[:-1]
    return out, pool, (q, kvs, extend, decode_rows, starts)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "lens", "span_len"),
    [
        (9, 3, 64, [1], 0),  # L=1: a sequence's first token
        (9, 3, 64, [400], 0),
        (9, 3, 64, [17, 1, 403, 64], 0),  # B>1, different lengths
        (4, 4, 32, [5, 33], 0),  # no GQA, another head size
        (9, 3, 64, [29, 7], 6),  # a mixed batch: the decode rows still take the kernel
    ],
)
def test_decode_attention_matches_float32_and_the_torch_path(
    kernels, monkeypatch, heads, kv_heads, d, lens, span_len
):
    args = (heads, kv_heads, d, lens, span_len, len(lens) * 1000 + d)
    got, pool, (q, kvs, extend, rows, starts) = attention_step(monkeypatch, True, *args)
    want, torch_pool, _ = attention_step(monkeypatch, False, *args)
    # The step's new K/V are stored exactly as index_copy_ stores them.
    assert torch.equal(pool.k_buffers[0], torch_pool.k_buffers[0])
    assert torch.equal(pool.v_buffers[0], torch_pool.v_buffers[0])
    decode = starts[rows]
    exact = reference_attention(
        q[decode], pool.k_buffers[0], pool.v_buffers[0], [kvs[i] for i in rows], d**-0.5,
        heads // kv_heads,
    )  # fmt: skip
    assert within_one_rounding(got[decode], exact)
    assert (got.float() - want.float()).abs().max() <= SDPA_ATOL


def test_decode_attention_refuses_a_slot_outside_the_pool(kernels, monkeypatch):
    monkeypatch.setenv(cpu_kernels.SWITCH_ENV, "1")
    pool = KVPool(1, 1, 16, 8, BF16)
    attn = TorchAttention(2, 1, 16, 0.25)
    kvs = [torch.tensor([1, 2, 8])]  # slot 8 is one past the end
    meta = attn.prepare(torch.tensor([8]), kvs, [1], torch.device("cpu"), BF16)
    q, kv = torch.ones(1, 2, 16, dtype=BF16), torch.ones(1, 1, 16, dtype=BF16)
    with pytest.raises(cpu_kernels.KernelError):
        attn.forward(q, kv, kv, 0, pool, meta)
    assert not pool.k_buffers[0].any()  # nothing was written


@pytest.fixture(scope="module")
def quantized(smollm2_folder):
    """The default model as served on the CPU: its GGUF weights, bfloat16 activations."""
    return load_model(None, dtype=BF16, quantize="gguf")


def greedy(model, prompts):
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=True, top_logprobs=2)
    return [choices[0] for choices in make_engine(model).generate(prompts, params)]


def assert_same_except_near_ties(want, got) -> None:
    for a, b in zip(want, got, strict=True):
        for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)):
            if x != y:
                top = a.logprobs[i].top
                margin = top[0][1] - top[1][1] if len(top) > 1 else float("inf")
                assert margin < TIE, f"parted at token {i} where torch was sure ({margin})"
                break
        else:
            assert a.text == b.text


def test_default_model_greedy_text_same_with_kernels_on_and_off(quantized, monkeypatch):
    prompts = [chat(quantized, q) for q in ("Write a haiku about rain.", "Name two planets.")]
    monkeypatch.setenv(cpu_kernels.SWITCH_ENV, "0")
    off = greedy(quantized, prompts)
    monkeypatch.setenv(cpu_kernels.SWITCH_ENV, "1")
    assert_same_except_near_ties(off, greedy(quantized, prompts))


def test_a_failed_build_keeps_the_torch_path_and_still_serves(
    quantized, monkeypatch, tmp_path, caplog
):
    """Both C libraries (the decode kernels and the int4 matmul) fail to build: one warning
    each, no half-built file, and the model serves through torch's ops exactly as when switched
    off."""
    monkeypatch.setenv(cpu_kernels.COMPILER_ENV, "/bin/false")
    monkeypatch.setenv("CORRAL_CACHE_DIR", str(tmp_path))
    cpu_kernels.library.cache_clear()
    cpu_int4.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert cpu_kernels.kernels_for(BF16, torch.device("cpu")) is None
            assert cpu_int4.int4_kernel() is None
            prompts = [chat(quantized, "Name two planets.")]
            served = greedy(quantized, prompts)
        warned = [(r.name, "unavailable" in r.message) for r in caplog.records]
        assert warned == [(cpu_kernels.__name__, True), (cpu_int4.__name__, True)]
        assert not list((tmp_path / "kernels").glob("*.so"))  # no half-built library left
        monkeypatch.setenv(cpu_kernels.SWITCH_ENV, "0")
        assert served[0].token_ids == greedy(quantized, prompts)[0].token_ids
    finally:
        cpu_kernels.library.cache_clear()
        cpu_int4.library.cache_clear()
