"""A tokenizer view shared by both grammar backends, with a stable fingerprint."""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import tokenizers
from transformers import PreTrainedTokenizerFast


class TokenizerInfo:
    """An HF fast tokenizer plus what the grammar layer needs to know about it.

    ``vocab_size`` is the *model's* vocabulary (the logits width); it may exceed the tokenizer's,
    and ids past the tokenizer's vocabulary are never allowed by a mask. ``eos_token_ids`` are the
    tokens that end a constrained generation. The backends' own tokenizer objects are built once,
    lazily, and shared by every constraint compiled for this tokenizer.
    """

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerFast,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        backend = copy.copy(hf_tokenizer.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        self.hf_tokenizer = hf_tokenizer
        self.tokenizer_json = backend.to_str()
        self.tokenizer_vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.vocab_size = int(vocab_size or self.tokenizer_vocab_size)
        if self.vocab_size < self.tokenizer_vocab_size:
            raise ValueError(
                f"vocab_size {self.vocab_size} is smaller than the tokenizer's "
                f"{self.tokenizer_vocab_size}; pass the model's full vocabulary size"
            )
        if eos_token_ids is None:
            eos_token_ids = (
                [hf_tokenizer.eos_token_id] if hf_tokenizer.eos_token_id is not None else []
            )
        self.eos_token_ids: tuple[int, ...] = tuple(int(t) for t in eos_token_ids)
        if not self.eos_token_ids:
            raise ValueError("a constrained tokenizer needs at least one EOS token id")
        self._lock = threading.Lock()

    @classmethod
    def from_hf(
        cls,
        hf_tokenizer: PreTrainedTokenizerFast,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> TokenizerInfo:
        return cls(hf_tokenizer, vocab_size=vocab_size, eos_token_ids=eos_token_ids)

    @classmethod
    def from_tokenizer_json(
        cls,
        path: str | Path,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> TokenizerInfo:
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_file(str(path)))
        return cls(hf, vocab_size=vocab_size, eos_token_ids=eos_token_ids)

    @cached_property
    def fingerprint(self) -> str:
        """Hex sha256 of the tokenizer's full definition, the logits width and the EOS ids."""
        h = hashlib.sha256(self.tokenizer_json.encode())
        h.update(f"|{self.vocab_size}|{','.join(map(str, self.eos_token_ids))}".encode())
        return h.hexdigest()

    @property
    def mask_words(self) -> int:
        """Width of one bitmask row in int32 words."""
        return (self.vocab_size + 31) // 32

    def encode(self, text: str) -> list[int]:
        return self.hf_tokenizer.encode(text, add_special_tokens=False)

    # The backend objects are expensive (about a second each) and shared: build each once.

    @cached_property
    def llguidance(self) -> Any:
        import llguidance

        with self._lock:
            return llguidance.LLTokenizer(
                self.tokenizer_json, n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids)
            )

    @cached_property
    def xgrammar(self) -> Any:
        import xgrammar

        with self._lock:
            return xgrammar.TokenizerInfo.from_huggingface(
                self.hf_tokenizer,
                vocab_size=self.vocab_size,
                stop_token_ids=list(self.eos_token_ids),
            )
