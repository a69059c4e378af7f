"""Helpers shared by the engine tests: an engine on one thread, and a chat prompt's token ids."""

from __future__ import annotations

from corral.engine.config import EngineConfig
from corral.engine.engine import Engine


def make_engine(model, **overrides) -> Engine:
    # One thread: the test machine is small and shared; results do not depend on it.
    return Engine(model, EngineConfig(num_threads=1, **overrides))


def chat(model, text: str) -> list[int]:
    """The token ids of a one-message chat with the model's own template."""
    enc = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return list(enc["input_ids"] if not isinstance(enc, list) else enc)
