"""A tokenizer view shared by both grammar backends, with a stable fingerprint.

``TokenizerInfo`` owns what is derived from one tokenizer: the backends' tokenizer objects, the
bytes of every token (:attr:`TokenizerInfo.token_bytes`, the one place a token's bytes come
from) and the indexes built over them (:meth:`TokenizerInfo.derived`). Each is built once, under
the tokenizer's own lock, and is complete before any thread sees it; nothing about a tokenizer
is kept in a module global.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import tokenizers
from transformers import PreTrainedTokenizerFast

T = TypeVar("T")


class TokenizerInfo:
    """An HF fast tokenizer plus what the grammar layer needs to know about it.

    ``vocab_size`` is the *model's* vocabulary (the logits width); it may exceed the tokenizer's,
    and ids past the tokenizer's vocabulary are never allowed by a mask. ``eos_token_ids`` are the
    tokens that end a constrained generation. The backends' own tokenizer objects, the token
    bytes and the indexes over them are built once, lazily, and shared by every constraint
    compiled for this tokenizer (and every thread using it).
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
        self._lock = threading.RLock()  # builds may nest (token_bytes needs llguidance)
        self._built: dict[Any, Any] = {}

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

    # What is built from the tokenizer is built once, under its lock, and stored complete.

    def derived(self, build: Callable[[TokenizerInfo], T]) -> T:
        """``build(self)``, built on first use and kept for this tokenizer's life: an index over
        its tokens (``distinct_keys.TokenIndex``, ``budget_close``'s token tables). ``build``
        is the key, so pass a module-level function; it runs once, whatever the threads."""
        return self._once(build, lambda: build(self))

    def _once(self, key: Any, build: Callable[[], T]) -> T:
        found = self._built.get(key, _MISSING)  # a stored value is complete: no lock to read
        if found is _MISSING:
            with self._lock:
                found = self._built.get(key, _MISSING)
                if found is _MISSING:
                    found = self._built[key] = build()
        return found

    @property
    def token_bytes(self) -> tuple[bytes, ...]:
        """The bytes of every token id below ``vocab_size``, exactly as the grammar backends
        match them (llguidance's ``decode_bytes``: byte-level BPE, byte fallback and added
        tokens alike; ids past the tokenizer's vocabulary are empty). The one way to get a
        token's bytes: the masks' scans and budget closing read this table."""
        return self._once("token_bytes", self._token_bytes)

    def _token_bytes(self) -> tuple[bytes, ...]:
        decode = self.llguidance.decode_bytes
        return tuple(decode([i]) for i in range(self.vocab_size))

    # The backend objects are expensive (about a second each) and shared: build each once.

    @property
    def llguidance(self) -> Any:
        return self._once("llguidance", self._llguidance)

    def _llguidance(self) -> Any:
        import llguidance

        return llguidance.LLTokenizer(
            self.tokenizer_json, n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids)
        )

    @property
    def xgrammar(self) -> Any:
        return self._once("xgrammar", self._xgrammar)

    def _xgrammar(self) -> Any:
        import xgrammar

        return xgrammar.TokenizerInfo.from_huggingface(
            self.hf_tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(self.eos_token_ids)
        )


_MISSING = object()
