"""Incremental detokenization with stop strings.

Text is decoded over a small sliding window of token ids (a few ids of context before the new
ones, so tokenizers that drop a leading space on the first token still decode it right), and is
only taken in once it does not end in U+FFFD: a multi-byte UTF-8 character split across tokens
is held back until its last byte arrives, so a delta never carries half a character.

Stop strings are searched in the decoded text. What is emitted holds back the longest tail that
could still grow into a stop string; a matched stop string and everything after it is cut
(the OpenAI behaviour: the stop string is not part of the output).
"""

from __future__ import annotations

from collections.abc import Sequence

_CONTEXT_TOKENS = 4


class Detokenizer:
    """Decoded text of one sequence's output, emitted in safe increments."""

    def __init__(
        self,
        tokenizer,
        prompt_ids: Sequence[int],
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        self._stop = tuple(stop)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self._searched = 0  # text before this index holds no stop string start
        self.text = ""  # all complete text so far (cut at a stop string once matched)
        self.emitted = 0  # characters of `text` already handed out

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(
            ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False
        )

    def add(self, token_id: int) -> None:
        """Take in one token; `text` grows by whatever is now complete."""
        self._ids.append(token_id)
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(self._prefix_text) and not full.endswith("\ufffd"):
            self.text += full[len(self._prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])

    def flush(self) -> None:
        """At the end: take in whatever is pending, even a trailing replacement character."""
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(self._prefix_text):
            self.text += full[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        self._prefix_text = ""

    def find_stop(self) -> bool:
        """Search the new text for a stop string; on a match cut `text` there and return True."""
        if not self._stop:
            return False
        start = max(0, self._searched - self._max_stop + 1)
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        self._searched = len(self.text)
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        return True

    def skip_stop_search(self) -> None:
        """Treat the text so far as searched (e.g. inside a constrained output)."""
        self._searched = len(self.text)

    def take(self, final: bool = False) -> str:
        """Text not yet emitted, minus a tail that may be the start of a stop string."""
        end = len(self.text) if final else len(self.text) - self._holdback()
        if end <= self.emitted:
            return ""
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta

    def _holdback(self) -> int:
        text = self.text
        for k in range(min(self._max_stop - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return k
        return 0
