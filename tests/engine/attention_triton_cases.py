"""TritonAttention under TRITON_INTERPRET=1 on CPU tensors, against TorchAttention and an fp32
reference.

Run by test_engine_attention_triton.py in a fresh interpreter, because the variable must be set
before triton is first imported and other packages' tests share the pytest process. Shapes stay
small (the interpreter executes every program in numpy), and `split_chunk` is small too, so short
contexts still take several split-K chunks.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1 (see test_engine_attention_triton.py)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from triton.runtime.interpreter import InterpreterBuilder, TensorHandle  # noqa: E402

from corral.engine.execution.attention import TorchAttention  # noqa: E402
from corral.engine.execution.attention_triton import TritonAttention  # noqa: E402
from corral.engine.kvcache.kv_pool import PAD_SLOT, KVPool  # noqa: E402

# Absolute and relative tolerance per dtype, against the fp32 reference; TorchAttention, which
# rounds differently, is held to twice as much. Outputs are averages of N(0, 1) values.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

_interp_dot = InterpreterBuilder.create_dot


def _dot_widening_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):
    # The interpreter keeps bf16 as raw uint16 bits and multiplies those as integers (triton 3.9);
    # widen to fp32 first (exact: bf16 is the top half of an fp32), as the GPU's MMA does.
    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        return TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    return _interp_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)


InterpreterBuilder.create_dot = _dot_widening_bf16

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
prefixes = st.one_of(st.just(0), st.integers(1, 20), st.integers(60, 160), st.integers(60, 160))
decodes = st.lists(st.tuples(prefixes, st.just(1)), max_size=3)
extends = st.lists(
    st.tuples(prefixes, st.one_of(st.integers(2, 12), st.integers(60, 72))), max_size=2
)


@st.composite
def batches(draw):
    return dict(
        group=draw(st.sampled_from([1, 4, 8])),
        num_kv_heads=draw(st.sampled_from([1, 2])),
        head_dim=draw(st.sampled_from([64, 128])),
        dtype=draw(st.sampled_from(list(TOLERANCE))),
        split_chunk=draw(st.sampled_from([8, 16, 40, 512])),
        max_splits=draw(st.sampled_from([3, 16])),
        seqs=draw(st.permutations(draw(decodes) + draw(extends)).filter(len)),
        layer=draw(st.integers(0, 1)),
        window=draw(st.one_of(st.none(), st.integers(1, 24), st.integers(50, 90))),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def reference(q, pool, layer, seq_kv, q_lens, group, scale, window=None):
    """Explicit fp32 softmax over each sequence's gathered K/V with a causal mask (and a sliding
    window: position `p` sees `p - window + 1 .. p`)."""
    k_buf, v_buf = pool.k_buffers[layer].float(), pool.v_buffers[layer].float()
    outs, start = [], 0
    for kv, n in zip(seq_kv, q_lens, strict=True):
        keys = k_buf[kv].repeat_interleave(group, dim=1)  # [L, H, D]
        values = v_buf[kv].repeat_interleave(group, dim=1)
        qs = q[start : start + n].float()  # [n, H, D]
        scores = torch.einsum("nhd,lhd->hnl", qs, keys) * scale
        pos = (len(kv) - n + torch.arange(n))[:, None]
        visible = torch.arange(len(kv))[None, :] <= pos
        if window is not None:
            visible &= torch.arange(len(kv))[None, :] > pos - window
        scores = scores.masked_fill(~visible, float("-inf"))
        outs.append(torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values).flatten(1))
        start += n
    return torch.cat(outs)


def run_case(case) -> None:
    gen = torch.Generator().manual_seed(case["seed"])
    hkv, d, dtype = case["num_kv_heads"], case["head_dim"], case["dtype"]
    heads = hkv * case["group"]
    q_lens = [n for _, n in case["seqs"]]
    kv_lens = [p + n for p, n in case["seqs"]]
    num_slots = sum(kv_lens) + 9
    pool = KVPool(2, hkv, d, num_slots, dtype)
    for buf in pool.k_buffers + pool.v_buffers:  # every slot but the pad slot holds a prefix
        buf[PAD_SLOT + 1 :] = torch.randn(buf[1:].shape, generator=gen).to(dtype)
    slots = torch.randperm(num_slots - 1, generator=gen) + 1  # shuffled, never the pad slot
    seq_kv = list(torch.split(slots[: sum(kv_lens)], kv_lens))
    out_slots = torch.cat([kv[len(kv) - n :] for kv, n in zip(seq_kv, q_lens, strict=True)])
    t = len(out_slots)
    # q and k are views of one [T, H + Hkv, D] tensor, as in the model: q is not contiguous.
    qk = torch.randn(t, heads + hkv, d, generator=gen).to(dtype)
    q, k = qk[:, :heads], qk[:, heads:]
    v = torch.randn(t, hkv, d, generator=gen).to(dtype)
    scale, layer, dev = d**-0.5, case["layer"], torch.device("cpu")

    windows = (case["window"], None) if case["layer"] == 0 else (None, case["window"])
    triton_attn = TritonAttention(
        heads, hkv, d, scale, windows,
        split_chunk=case["split_chunk"], max_splits=case["max_splits"],
    )  # fmt: skip
    torch_pool = KVPool(2, hkv, d, num_slots, dtype)
    for mine, theirs in zip(pool.k_buffers + pool.v_buffers, torch_pool.k_buffers + torch_pool.v_buffers, strict=True):  # fmt: skip
        theirs.copy_(mine)
    got = triton_attn.forward(
        q, k, v, layer, pool, triton_attn.prepare(out_slots, seq_kv, q_lens, dev, dtype)
    )
    torch_attn = TorchAttention(heads, hkv, d, scale, windows)
    expected = torch_attn.forward(
        q, k, v, layer, torch_pool, torch_attn.prepare(out_slots, seq_kv, q_lens, dev, dtype)
    )

    assert torch.equal(pool.k_buffers[layer][out_slots], k)
    assert torch.equal(pool.v_buffers[layer][out_slots], v)
    assert torch.equal(pool.k_buffers[layer], torch_pool.k_buffers[layer])
    assert got.shape == (t, heads * d) and got.dtype == dtype
    tol = TOLERANCE[dtype]
    ref = reference(q, pool, layer, seq_kv, q_lens, case["group"], scale, case["window"])
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(got.float(), expected.float(), atol=2 * tol, rtol=2 * tol)


@SETTINGS
@given(case=batches())
def check_against_references(case):
    run_case(case)


def check_fixed_cases() -> None:
    # A decode over 16 splits, or capped at 4 (then whole blocks per split), beside a fresh
    # prefill of two query blocks, a draft over a long prefix and a decode of a 1-token context.
    seqs = [(300, 1), (0, 70), (130, 5), (0, 1)]
    for dtype, max_splits in ((torch.float32, 16), (torch.float16, 4), (torch.bfloat16, 4)):
        run_case(
            dict(
                group=4, num_kv_heads=2, head_dim=64, dtype=dtype, split_chunk=8,
                max_splits=max_splits, seqs=seqs, layer=1, seed=7, window=None,
            )
        )  # fmt: skip
    # The same with a sliding window shorter than every split and query block (Gemma 3's
    # local layers): splits before the window are empty, query blocks start mid-context.
    for window in (5, 40):
        run_case(
            dict(
                group=4, num_kv_heads=2, head_dim=64, dtype=torch.float32, split_chunk=8,
                max_splits=16, seqs=seqs, layer=0, seed=8, window=window,
            )
        )  # fmt: skip


def check_empty_batch() -> None:
    attn = TritonAttention(4, 2, 64, 0.125)
    pool = KVPool(1, 2, 64, 4)
    meta = attn.prepare(torch.zeros(0, dtype=torch.int64), [], [], torch.device("cpu"))
    q, kv = torch.zeros(0, 4, 64), torch.zeros(0, 2, 64)
    assert attn.forward(q, kv, kv, 0, pool, meta).shape == (0, 256)


def check_model_forward() -> None:
    """The whole decoder with TritonAttention, through the model runner, matches the same model
    with TorchAttention: a prefill of two sequences, then a draft-sized extend of one beside a
    decode of the other, over their cached prefixes; for a Llama and for a Gemma 3 shaped decoder
    whose first layer has a 6-token sliding window."""
    from corral.engine.execution.model_config import ModelConfig, RopeConfig

    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16, max_position_embeddings=512)  # fmt: skip
    gemma = dict(hidden_act="gelu_pytorch_tanh", qk_norm=True, sandwich_norms=True,
                 embed_scale=8.0, layer_windows=(6, None), layer_rope=("local", "global"),
                 local_rope=RopeConfig(theta=100.0))  # fmt: skip
    _model_forward(ModelConfig(model_type="llama", **shape))
    _model_forward(ModelConfig(model_type="gemma3_text", **shape, **gemma))


def _model_forward(c) -> None:
    from corral.engine.execution.batch import ForwardBatch
    from corral.engine.execution.model import DecoderModel
    from corral.engine.execution.model_runner import ModelRunner

    torch.manual_seed(0)
    model = DecoderModel(c, torch.float32, "cpu")
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    runners = [
        ModelRunner(model, attention, pack_weights=False)
        for attention in (
            TorchAttention(c.num_heads, c.num_kv_heads, c.head_dim, c.attn_scale, c.layer_windows),
            TritonAttention(
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                c.attn_scale,
                c.layer_windows,
                split_chunk=8,
            ),
        )
    ]
    logits = []
    for runner in runners:
        pool = runner.make_kv_pool(128)
        a, b = pool.alloc(40), pool.alloc(9)
        steps = [
            ([list(range(1, 41)), list(range(50, 59))], [a, b]),
            ([[7, 8, 9, 10], [11]], [torch.cat([a, pool.alloc(4)]), torch.cat([b, pool.alloc(1)])]),
        ]
        logits.append([runner.forward(ForwardBatch.from_sequences(*step), pool) for step in steps])
    for want, got in zip(*logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


if __name__ == "__main__":
    checks = (check_empty_batch, check_fixed_cases, check_model_forward, check_against_references)
    for check in checks:
        check()
        print(f"{check.__name__}: ok", flush=True)
    print("all Triton attention interpreter checks passed")
