"""One C call per decoder layer on decode-only CPU steps (`corral.engine.kernels.fused_decode`).

The fused layer runs the same kernels in the same order as the layer-by-layer path, so greedy
tokens and their logprobs must be the same bit for bit, for one sequence and for a batch.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import chat, make_engine
from gguf import GGMLQuantizationType as QT
from gguf_factory import write_random_llama_gguf

from corral.engine import SamplingParams
from corral.engine.execution.batch import ForwardBatch
from corral.engine.kernels import cpu_int4, cpu_kernels, fused_decode
from corral.engine.kernels.fused_decode import FusedDecode
from corral.engine.loading.assets import default_gguf_path, load_model

BF16 = torch.bfloat16

pytestmark = pytest.mark.skipif(
    cpu_int4.int4_kernel() is None or cpu_kernels.library() is None,
    reason="the fused decode layer needs both C libraries (AVX512-VNNI for the int4 matmul)",
)


@pytest.fixture(scope="module")
def quantized(smollm2_folder):
    """The default model as served on the CPU: its GGUF weights, bfloat16 activations."""
    return load_model(None, dtype=BF16, quantize="gguf")


def run(model, prompts, fused: bool, monkeypatch):
    monkeypatch.setenv(fused_decode.SWITCH_ENV, "1" if fused else "0")
    params = SamplingParams(max_tokens=20, temperature=0, logprobs=True, top_logprobs=3)
    return make_engine(model).generate(prompts, params)


@pytest.mark.parametrize("n", [1, 3])
def test_fused_steps_equal_the_layer_by_layer_path_bit_for_bit(quantized, monkeypatch, n):
    questions = ["Name two planets.", "Write a haiku about rain.", "What is 2 + 2?"][:n]
    prompts = [chat(quantized, q) for q in questions]
    fused = run(quantized, prompts, True, monkeypatch)
    assert quantized.runner.model._fused[1] is not None  # the fused path ran
    layers = run(quantized, prompts, False, monkeypatch)
    for (a,), (b,) in zip(fused, layers, strict=True):
        assert a.token_ids == b.token_ids
        assert [(lp.logprob, lp.top) for lp in a.logprobs] == [
            (lp.logprob, lp.top) for lp in b.logprobs
        ]


@pytest.mark.parametrize(("qtype", "fuses"), [(QT.Q4_0, True), (QT.Q4_K, True), (QT.Q8_0, False)])
def test_fused_only_where_every_layer_can(tmp_path, qtype, fuses):
    """Q8_0 matmul weights are two 4-bit halves side by side (the input fed twice): layer by
    layer. The other 4-bit types fuse."""
    path = write_random_llama_gguf(default_gguf_path(), tmp_path / "m.gguf", qtype)
    model = load_model(str(path), dtype=BF16, quantize="gguf").runner.model
    got = FusedDecode.for_model(model, cpu_kernels.library(), 0.125)
    assert (got is not None) == fuses


def test_a_slot_outside_the_pool_is_an_error_not_a_write(quantized):
    runner = quantized.runner
    pool = runner.make_kv_pool(8)
    prompt = chat(quantized, "Hi")[:4]
    kv = pool.alloc(len(prompt))
    runner.forward(ForwardBatch.from_sequences([prompt], [kv]), pool)  # prefill: layer by layer
    before = [b.clone() for b in pool.k_buffers]
    bad = torch.cat((kv, torch.tensor([8])))  # slot 8 is one past the end
    with pytest.raises(cpu_kernels.KernelError):
        runner.forward(ForwardBatch.from_sequences([[prompt[-1]]], [bad]), pool)
    assert runner.model._fused[1] is not None  # refused by the fused path's attention
    assert all(torch.equal(a, b) for a, b in zip(before, pool.k_buffers, strict=True))
