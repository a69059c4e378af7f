"""Decode through CUDA graphs' static buffers (`engine.cuda_graphs`).

On the CPU the static-buffer path runs eagerly (`capture=False`): the real batch is copied into
the buffers, padded to its bucket with rows that write only the scratch slot, and the logits are
sliced back out. Everything but the capture is checked against the plain path, for batch sizes
on and between bucket boundaries, at the runner (logits, and what the KV pool holds after) and
through the engine (greedy tokens, with and without overlap). On CUDA (skipped here;
bench/gpu_check.sh runs it on a GPU) the same comparisons run with the graphs captured.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import chat, make_engine
from test_engine_cuda import tiny_llama3_folder  # noqa: F401 - the fixture, shared

from corral.engine import SamplingParams
from corral.engine.execution.batch import ForwardBatch
from corral.engine.execution.cuda_graphs import DecodeGraphs, decode_buckets
from corral.engine.kvcache.kv_pool import PAD_SLOT

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPTS = ("A city.", "Say hi.", "Count to five.", "Name a fruit.", "Why?", "Tell me a joke.")


def test_buckets_are_powers_of_two_then_the_largest_batch():
    assert decode_buckets(1) == [1]
    assert decode_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert decode_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def _prefilled(runner, pool, n: int):
    """`n` sequences of different lengths, prefilled the plain way; one more slot each for the
    decode step."""
    ids = [[(7 * s + 3 * i) % 500 + 10 for i in range(3 + 2 * s)] for s in range(n)]
    kvs = [pool.alloc(len(x)) for x in ids]
    runner.forward(ForwardBatch.from_sequences(ids, kvs), pool)
    return [torch.cat([kv, pool.alloc(1)]) for kv in kvs]


@pytest.mark.parametrize("n", [1, 3, 4, 5, 9, 12])
def test_static_buffers_give_the_plain_logits_and_touch_only_the_scratch_slot(tiny_model, n):
    runner = tiny_model.runner
    pool = runner.make_kv_pool(512)
    graphs = DecodeGraphs(runner, pool, max_batch=12, max_len=64, capture=False)
    kvs = _prefilled(runner, pool, n)
    batch = ForwardBatch.from_sequences([[11 + s] for s in range(n)], kvs)
    assert graphs.fits(batch, pool)
    want = runner.forward(batch, pool)  # plain path: stores the step's K/V
    kv_after = [b.clone() for b in pool.k_buffers]
    runner.decode_graphs = graphs
    try:
        got = runner.forward(batch, pool)  # through the buffers, padded to the bucket
    finally:
        runner.decode_graphs = None
    assert graphs.steps == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    real = torch.ones(pool.num_slots, dtype=torch.bool)
    real[PAD_SLOT] = False
    for before, after in zip(kv_after, pool.k_buffers, strict=True):
        # the same K/V in every real slot; padding rows wrote the scratch slot alone
        torch.testing.assert_close(after[real], before[real], rtol=1e-6, atol=1e-6)


def test_what_does_not_fit_runs_the_plain_way(tiny_model):
    runner = tiny_model.runner
    pool = runner.make_kv_pool(512)
    graphs = DecodeGraphs(runner, pool, max_batch=4, max_len=64, capture=False)
    kvs = _prefilled(runner, pool, 5)
    assert not graphs.fits(ForwardBatch.from_sequences([[1]] * 5, kvs), pool)  # too many
    assert not graphs.fits(ForwardBatch.from_sequences([[1, 2]], [kvs[0]]), pool)  # an extend
    other = runner.make_kv_pool(64)
    assert not graphs.fits(ForwardBatch.from_sequences([[1]], [kvs[0]]), other)  # another pool
    long = DecodeGraphs(runner, pool, max_batch=4, max_len=8, capture=False)
    assert not long.fits(ForwardBatch.from_sequences([[1]], [kvs[4]]), pool)  # past max_len


@pytest.mark.parametrize("overlap", [False, True])
def test_engine_decodes_the_same_tokens_through_the_static_buffers(tiny_model, overlap):
    prompts = [chat(tiny_model, p) for p in PROMPTS]
    settings = dict(max_num_seqs=6, overlap=overlap)
    want = make_engine(tiny_model, **settings).generate(prompts, GREEDY)
    eng = make_engine(tiny_model, **settings)
    runner = eng.runner
    graphs = runner.use_decode_graphs(eng.pool, 6, eng.max_model_len, capture=False)
    try:
        got = eng.generate(prompts, GREEDY)
    finally:
        runner.decode_graphs = None
        eng.close()
    # batches of 6 down to 1 as requests finish cross the buckets 8, 4, 2, 1
    assert graphs.steps > 0
    assert [c[0].token_ids for c in got] == [c[0].token_ids for c in want]


# ---- on CUDA: captured graphs ------------------------------------------------------------------

cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (run bench/gpu_check.sh on one)"
)


@pytest.fixture(scope="module")
def cuda_model(tiny_llama3_folder):  # noqa: F811 - the imported fixture
    """The GPU check's tiny Llama (Llama-3's tokenizer: the default model's package is not on
    the GPU box), bfloat16 on the device."""
    from corral.engine.loading.assets import load_model

    return load_model(str(tiny_llama3_folder), dtype=torch.bfloat16, device="cuda")


@cuda
@pytest.mark.parametrize("n", [1, 3, 8, 13])
@pytest.mark.parametrize("max_len", [256, 4096])  # one decode split; eight, most of them empty
def test_captured_graphs_give_the_eager_logits(cuda_model, n, max_len):
    runner = cuda_model.runner
    pool = runner.make_kv_pool(1024)
    graphs = DecodeGraphs(runner, pool, max_batch=16, max_len=max_len)
    assert graphs.captured
    kvs = _prefilled(runner, pool, n)
    batch = ForwardBatch.from_sequences([[11 + s] for s in range(n)], kvs)
    want = runner.forward(batch, pool)
    runner.decode_graphs = graphs
    try:
        got = runner.forward(batch, pool)
    finally:
        runner.decode_graphs = None
    assert graphs.steps == 1
    torch.testing.assert_close(got, want, rtol=0, atol=0.05)


@cuda
@pytest.mark.parametrize("overlap", [False, True])
def test_cuda_graphs_on_and_off_generate_the_same_tokens(cuda_model, overlap):
    prompts = [cuda_model.tokenizer(p)["input_ids"] for p in PROMPTS]
    runs = []
    for on in (True, False):
        eng = make_engine(
            cuda_model, max_num_seqs=6, overlap=overlap, cuda_graphs=on,
            gpu_memory_fraction=None, kv_cache_bytes=64 << 20,
        )  # fmt: skip
        assert (eng.runner.decode_graphs is not None) == on
        runs.append([c[0].token_ids for c in eng.generate(prompts, GREEDY)])
        if on:
            assert eng.runner.decode_graphs.steps > 0
        eng.runner.decode_graphs = None
        eng.close()
    assert runs[0] == runs[1]
