"""The embedded SmolLM2-135M-Instruct: our GGUF conversion and forward vs transformers' own.

The reference is built independently of the engine: transformers' GGUF reader dequantizes the same
file and undoes llama.cpp's Q/K permutation with its own code, into a `LlamaForCausalLM`.
Tolerance: max |logits diff| <= 2e-3 on logits of magnitude ~40 (observed ~1e-4): both sides are
float32, but fused Q/K/V and gate/up matmuls and a different attention kernel sum in a different
order, and the rounding compounds over 30 layers. The greedy token must agree on every row.
"""

from __future__ import annotations

import json

import pytest
import torch
from gguf import GGUFReader

from corral.engine.execution.batch import ForwardBatch
from corral.engine.loading.assets import default_gguf_path, ensure_converted
from corral.engine.loading.gguf_loader import unpermute_qk

ATOL = 2e-3


@pytest.fixture(scope="module")
def reference(smollm2_folder) -> torch.nn.Module:
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = str(default_gguf_path())
    meta = load_gguf_checkpoint(path)["config"]
    config = transformers.LlamaConfig(**{k: v for k, v in meta.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    state = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    model.to_empty(device="cpu")
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # buffers lost on `meta`
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    return model.eval()


def _prompt(tokenizer, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    diff = (got - want).abs().max().item()
    assert diff <= ATOL, f"max |logits diff| {diff:.3g} > {ATOL}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_logits_match_transformers_prefill_decode_and_cached_prefix(smollm2, reference):
    tok, runner = smollm2.tokenizer, smollm2.runner
    a = _prompt(tok, "Give me a JSON object describing a cat.")
    b = _prompt(tok, "Name three colours.")
    with torch.no_grad():
        want_a = reference(torch.tensor([a])).logits[0]
        want_b = reference(torch.tensor([b])).logits[0]
    pool = runner.make_kv_pool(512)

    # Prefill B fully, and A's first 30 tokens; all rows of B, the last row of A's part.
    kv_a, kv_b = pool.alloc(30), pool.alloc(len(b))
    rows = torch.cat([torch.tensor([29]), 30 + torch.arange(len(b))])
    logits = runner.forward(ForwardBatch.from_sequences([a[:30], b], [kv_a, kv_b], rows), pool)
    _close(logits, torch.cat([want_a[29:30], want_b]))

    # Prefill the rest of A on top of its cached 30-token prefix, one decode step for B.
    kv_a = torch.cat([kv_a, pool.alloc(len(a) - 30)])
    kv_b = torch.cat([kv_b, pool.alloc(1)])
    nxt = int(want_b[-1].argmax())
    logits = runner.forward(ForwardBatch.from_sequences([a[30:], [nxt]], [kv_a, kv_b]), pool)
    with torch.no_grad():
        want_b2 = reference(torch.tensor([b + [nxt]])).logits[0, -1]
    _close(logits, torch.stack([want_a[-1], want_b2]))
    b = b + [nxt]

    # Three greedy decode steps of both, batched; compared with the reference on the full texts.
    steps = []
    for _ in range(3):
        nxt_a, nxt_b = (int(x) for x in logits.argmax(-1))
        a, b = a + [nxt_a], b + [nxt_b]
        kv_a, kv_b = torch.cat([kv_a, pool.alloc(1)]), torch.cat([kv_b, pool.alloc(1)])
        logits = runner.forward(ForwardBatch.from_sequences([[nxt_a], [nxt_b]], [kv_a, kv_b]), pool)
        steps.append(logits)
    with torch.no_grad():
        want_a, want_b = (reference(torch.tensor([s])).logits[0, -3:] for s in (a, b))
    _close(torch.stack(steps, dim=1), torch.stack([want_a, want_b]))


def test_config_and_tokenizer_come_from_the_gguf_metadata(smollm2):
    reader = GGUFReader(default_gguf_path())

    def meta(key):
        return reader.fields[key].contents()

    c = smollm2.config
    assert c.vocab_size == meta("llama.vocab_size") == 49152
    assert len(smollm2.tokenizer) == len(meta("tokenizer.ggml.tokens")) == c.vocab_size
    assert c.tie_word_embeddings and "output.weight" not in {t.name for t in reader.tensors}
    assert c.rope.theta == meta("llama.rope.freq_base")
    assert c.rms_norm_eps == pytest.approx(meta("llama.attention.layer_norm_rms_epsilon"))
    assert smollm2.max_position_embeddings == meta("llama.context_length")
    assert (c.num_heads, c.num_kv_heads, c.num_layers) == (9, 3, 30)
    im_end = smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert smollm2.eos_token_ids == [im_end] == [meta("tokenizer.ggml.eos_token_id")]
    assert smollm2.chat_template == meta("tokenizer.chat_template")
    text = smollm2.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_conversion_is_cached_as_a_plain_hf_folder(smollm2_folder):
    before = (smollm2_folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_converted(default_gguf_path()) == smollm2_folder
    assert (smollm2_folder / "model.safetensors").stat().st_mtime_ns == before
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (smollm2_folder / name).is_file()


def test_unpermute_inverts_llama_cpp_rotary_permutation():
    # llama.cpp's converter, restated: per head, rows (i, i + d/2) become neighbours (2i, 2i+1).
    def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
        d = w.shape[0] // n_head
        return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(4 * 8, 3)
    assert torch.equal(torch.from_numpy(unpermute_qk(permute(w, 4).numpy(), 4)), w)
    bias = torch.arange(4 * 8, dtype=torch.float32)
    assert torch.equal(torch.from_numpy(unpermute_qk(permute(bias, 4).numpy(), 4)), bias)
    assert not torch.equal(permute(w, 4), w)


def test_load_model_from_a_folder_path(tiny_model, smollm2):
    # The tiny fixture model: a transformers-saved folder plus SmolLM2's tokenizer files.
    assert tiny_model.name.startswith("tiny-llama")
    assert tiny_model.chat_template == smollm2.chat_template
    assert tiny_model.eos_token_ids == smollm2.eos_token_ids
    assert tiny_model.config.num_layers == 2 and tiny_model.vocab_size == 49152
    runner = tiny_model.runner
    pool = runner.make_kv_pool(32)
    ids = tiny_model.tokenizer("hello world")["input_ids"]
    logits = runner.forward(ForwardBatch.from_sequences([ids], [pool.alloc(len(ids))]), pool)
    assert logits.shape == (1, 49152) and bool(torch.isfinite(logits).all())
