"""Attention and the KV pool on a CUDA GPU, at realistic shapes; skipped where there is none.

TritonAttention is compared with TorchAttention and with an explicit float64 softmax over each
sequence's gathered K/V. The interpreter tests (test_engine_attention_triton.py) cover the same
kernels on small shapes everywhere else.
"""

from __future__ import annotations

import pytest
import torch

from corral.engine.execution.attention import TorchAttention
from corral.engine.kvcache.kv_pool import PAD_SLOT, KVPool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Absolute and relative tolerance against the float64 reference; TorchAttention gets twice this.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
# (prefix, new tokens) per sequence, drawn per scenario by `_batch`.
SCENARIOS = {
    "decode-64": lambda g: [(int(torch.randint(0, 4096, (1,), generator=g)), 1) for _ in range(64)],
    "decode-long": lambda g: [(4095, 1), (0, 1), (2047, 1)],
    "mixed": lambda g: [(3000, 1), (0, 512), (1500, 200), (700, 1), (2048, 7), (0, 1)] * 2,
    "prefill": lambda g: [(0, 1000), (0, 3), (0, 64)],
}


def _reference(q, k_buf, v_buf, seq_kv, q_lens, group, scale):
    outs, start = [], 0
    for kv, n in zip(seq_kv, q_lens, strict=True):
        kv = kv.to(k_buf.device)
        keys = k_buf[kv].double().repeat_interleave(group, dim=1)  # [L, H, D]
        values = v_buf[kv].double().repeat_interleave(group, dim=1)
        qs = q[start : start + n].double()
        scores = torch.einsum("nhd,lhd->hnl", qs, keys) * scale
        pos = torch.arange(len(kv), device=q.device)
        last = len(kv) - n + torch.arange(n, device=q.device)
        scores = scores.masked_fill(pos[None, :] > last[:, None], float("-inf"))
        outs.append(torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values).flatten(1))
        start += n
    return torch.cat(outs)


def _batch(seqs, pool, gen):
    """Shuffled slots for each sequence's prefix + new tokens, and the new tokens' slots."""
    kv_lens = [p + n for p, n in seqs]
    slots = torch.randperm(pool.num_slots - 1, generator=gen)[: sum(kv_lens)] + 1
    seq_kv = list(torch.split(slots, kv_lens))
    out_slots = torch.cat([kv[len(kv) - n :] for kv, (_, n) in zip(seq_kv, seqs, strict=True)])
    return seq_kv, out_slots


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 128), (16, 16, 64), (32, 4, 64)])
def test_triton_attention_matches_torch_and_reference(scenario, dtype, heads, kv_heads, head_dim):
    pytest.importorskip("triton")
    from corral.engine.execution.attention_triton import TritonAttention

    dev, gen = torch.device("cuda"), torch.Generator().manual_seed(0)
    seqs = SCENARIOS[scenario](gen)
    q_lens = [n for _, n in seqs]
    pool = KVPool(1, kv_heads, head_dim, sum(p + n for p, n in seqs) + 100, dtype, dev)
    for buf in pool.k_buffers + pool.v_buffers:
        buf[PAD_SLOT + 1 :].normal_()
    seq_kv, out_slots = _batch(seqs, pool, gen)
    t, scale = len(out_slots), head_dim**-0.5
    qk = torch.randn(t, heads + kv_heads, head_dim, device=dev, dtype=dtype)
    q, k = qk[:, :heads], qk[:, heads:]  # views of one tensor, as in the model
    v = torch.randn(t, kv_heads, head_dim, device=dev, dtype=dtype)
    out_dev = out_slots.to(dev)

    mine = TritonAttention(heads, kv_heads, head_dim, scale)
    got = mine.forward(q, k, v, 0, pool, mine.prepare(out_dev, seq_kv, q_lens, dev, dtype))
    assert torch.equal(pool.k_buffers[0][out_dev], k)
    assert torch.equal(pool.v_buffers[0][out_dev], v)
    theirs = TorchAttention(heads, kv_heads, head_dim, scale)
    expected = theirs.forward(q, k, v, 0, pool, theirs.prepare(out_dev, seq_kv, q_lens, dev, dtype))
    ref = _reference(
        q, pool.k_buffers[0], pool.v_buffers[0], seq_kv, q_lens, heads // kv_heads, scale
    )

    tol = TOLERANCE[dtype]
    assert got.shape == (t, heads * head_dim) and got.dtype == dtype
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(got.float(), expected.float(), atol=2 * tol, rtol=2 * tol)


def test_triton_forward_never_synchronises_with_the_host():
    pytest.importorskip("triton")
    from corral.engine.execution.attention_triton import TritonAttention

    dev, gen = torch.device("cuda"), torch.Generator().manual_seed(1)
    seqs = [(2000, 1), (0, 100), (300, 1), (50, 9)]
    pool = KVPool(2, 8, 128, 4000, torch.bfloat16, dev)
    seq_kv, out_slots = _batch(seqs, pool, gen)
    attn = TritonAttention(32, 8, 128, 128**-0.5, split_chunk=256)
    meta = attn.prepare(out_slots.to(dev), seq_kv, [n for _, n in seqs], dev, torch.bfloat16)
    q = torch.randn(len(out_slots), 32, 128, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(len(out_slots), 8, 128, device=dev, dtype=torch.bfloat16)
    attn.forward(q, kv, kv, 0, pool, meta)  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = attn.forward(q, kv, kv, 1, pool, meta)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(out.float()).all()


def test_kv_pool_on_cuda_allocates_frees_and_keeps_buffers_on_the_gpu():
    pool = KVPool(2, 4, 64, num_slots=100, dtype=torch.bfloat16, device="cuda")
    assert pool.device.type == "cuda"
    assert all(b.is_cuda and b.dtype == torch.bfloat16 for b in pool.k_buffers + pool.v_buffers)
    assert not bool(pool.k_buffers[0].any())  # zeros: the pad slot and unused slots are finite
    got = pool.alloc(10)
    assert got is not None and got.device.type == "cpu"  # the free list stays on the host
    assert PAD_SLOT not in got.tolist() and pool.num_free == 89
    pool.k_buffers[1][got.to("cuda")] = 1.0
    pool.free(got)
    pool.check_integrity()
    assert pool.num_free == pool.capacity == 99
    big = KVPool.from_budget(1 << 26, 2, 4, 64, torch.float16, "cuda")
    assert big.k_buffers[0].is_cuda and big.alloc(big.capacity) is not None
