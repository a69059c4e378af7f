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
