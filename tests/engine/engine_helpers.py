"""Helpers shared by the engine tests: an engine on one thread, and a chat prompt's token ids."""

from __future__ import annotations

from pathlib import Path

import torch

from corral.engine.serving.config import EngineConfig
from corral.engine.serving.engine import Engine


def make_engine(model, **overrides) -> Engine:
    # One thread: the test machine is small and shared; results do not depend on it.
    return Engine(model, EngineConfig(num_threads=1, **overrides))


def chat(model, text: str) -> list[int]:
    """The token ids of a one-message chat with the model's own template."""
    enc = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return list(enc["input_ids"] if not isinstance(enc, list) else enc)


def save_tiny_llama(folder: Path, vocab_size: int, bos_token_id: int, eos_token_id) -> None:
    """A 2-layer random Llama (hidden 64, 4 heads / 2 KV heads, tied embeddings) saved by
    transformers into `folder`; seed 0, so its logits are meaningless but deterministic."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)


# --- the decoder against transformers (test_engine_model.py, test_engine_architectures.py) ---
#
# Each scenario runs sequences through the engine's runner as a ragged batch over its paged KV
# pool and compares logits with transformers' full forward over each whole sequence (no KV
# cache); `close(got, want)` is the caller's tolerance check.


def save_random(cls, config, folder: Path) -> torch.nn.Module:
    """A seeded random `cls(config)` saved into `folder`; biases and norm weights are randomised
    too (transformers initialises them to constants), so every weight matters."""
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(folder)
    return model


def reference_logits(ref: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """transformers' float32 logits `[len(ids), vocab]` over the whole sequence."""
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float()


def random_seqs(lens: list[int], seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lens]


def check_prefill_then_decode(runner, ref, close, vocab: int) -> None:
    """Prefill three sequences in one batch (every row), four batched decode steps, then one
    decode of a single sequence (the unpadded path)."""
    from corral.engine.execution.batch import ForwardBatch

    pool = runner.make_kv_pool(256)
    seqs = random_seqs([17, 5, 30], 1, vocab)
    kv = [pool.alloc(len(s)) for s in seqs]
    every_row = torch.arange(sum(map(len, seqs)))
    logits = runner.forward(ForwardBatch.from_sequences(seqs, kv, every_row), pool)
    close(logits, torch.cat([reference_logits(ref, s) for s in seqs]))
    extra = random_seqs([4, 4, 4], 2, vocab)
    for step in range(4):
        kv = [torch.cat([ix, pool.alloc(1)]) for ix in kv]
        new = [[e[step]] for e in extra]
        logits = runner.forward(ForwardBatch.from_sequences(new, kv), pool)
        for s, n in zip(seqs, new, strict=True):
            s.extend(n)
        close(logits, torch.stack([reference_logits(ref, s)[-1] for s in seqs]))
    kv1 = torch.cat([kv[1], pool.alloc(1)])
    logits = runner.forward(ForwardBatch.from_sequences([[7]], [kv1]), pool)
    close(logits[0], reference_logits(ref, seqs[1] + [7])[-1])


def check_cached_prefix_and_mixed_batch(runner, ref, close, vocab: int) -> None:
    """Two sequences on a cached prefix's slots, as the radix cache hands them out: one extends
    by several tokens, the other (on part of the prefix) by one, in one ragged batch; then both
    decode two steps."""
    from corral.engine.execution.batch import ForwardBatch

    pool = runner.make_kv_pool(256)
    base, tail_a, tail_b = random_seqs([20, 9, 1], 3, vocab)
    prefix_kv = pool.alloc(len(base))
    runner.forward(ForwardBatch.from_sequences([base], [prefix_kv]), pool)
    kv_a = torch.cat([prefix_kv, pool.alloc(len(tail_a))])
    kv_b = torch.cat([prefix_kv[:12], pool.alloc(len(tail_b))])
    rows = torch.tensor([0, 4, len(tail_a) - 1, len(tail_a)])
    logits = runner.forward(ForwardBatch.from_sequences([tail_a, tail_b], [kv_a, kv_b], rows), pool)
    a, b = base + tail_a, base[:12] + tail_b
    close(logits[:3], reference_logits(ref, a)[len(base) :][[0, 4, len(tail_a) - 1]])
    close(logits[3], reference_logits(ref, b)[-1])
    for t in (11, 12):
        kv_a, kv_b = torch.cat([kv_a, pool.alloc(1)]), torch.cat([kv_b, pool.alloc(1)])
        a, b = a + [t], b + [t + 1]
        logits = runner.forward(ForwardBatch.from_sequences([[t], [t + 1]], [kv_a, kv_b]), pool)
        close(logits, torch.stack([reference_logits(ref, a)[-1], reference_logits(ref, b)[-1]]))


def check_chunked_prefill(runner, ref, close, vocab: int) -> None:
    """A 45-token prompt prefilled in chunks of 16, 16 and 13 (every row's logits), each chunk
    in the same batch as another sequence's decode step."""
    from corral.engine.execution.batch import ForwardBatch

    pool = runner.make_kv_pool(256)
    prompt, other = random_seqs([45, 10], 5, vocab)
    kv_o = pool.alloc(len(other))
    runner.forward(ForwardBatch.from_sequences([other], [kv_o]), pool)
    kv, done = torch.empty(0, dtype=torch.int64), 0
    for size in (16, 16, 13):
        chunk = prompt[done : done + size]
        kv, kv_o = torch.cat([kv, pool.alloc(size)]), torch.cat([kv_o, pool.alloc(1)])
        other = other + [size]
        rows = torch.arange(size + 1)
        batch = ForwardBatch.from_sequences([chunk, [size]], [kv, kv_o], rows)
        logits = runner.forward(batch, pool)
        done += size
        close(logits[:size], reference_logits(ref, prompt[:done])[done - size :])
        close(logits[size], reference_logits(ref, other)[-1])


def check_mixed_length_decode(runner, ref, close, vocab: int) -> None:
    """A decode step over sequences of very different lengths (padding masked)."""
    from corral.engine.execution.batch import ForwardBatch

    pool = runner.make_kv_pool(256)
    seqs = random_seqs([2, 60, 11], 4, vocab)
    kv = [pool.alloc(len(s)) for s in seqs]
    runner.forward(ForwardBatch.from_sequences(seqs, kv), pool)
    kv = [torch.cat([ix, pool.alloc(1)]) for ix in kv]
    logits = runner.forward(ForwardBatch.from_sequences([[5], [6], [7]], kv), pool)
    want = [reference_logits(ref, s + [t])[-1] for s, t in zip(seqs, [5, 6, 7], strict=True)]
    close(logits, torch.stack(want))


SCENARIOS = {
    "prefill-decode": check_prefill_then_decode,
    "chunked-prefill": check_chunked_prefill,
    "cached-prefix-mixed-batch": check_cached_prefix_and_mixed_batch,
    "mixed-length-decode": check_mixed_length_decode,
}
