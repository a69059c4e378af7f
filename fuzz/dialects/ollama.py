"""Ollama's native chat: ``POST /api/chat`` with the schema as ``format``, not streamed.

The model is required (the first one ``/api/tags`` lists, unless ``--model`` names one); the
answer is ``message.content``, ``done_reason`` ``length`` when the token limit
(``options.num_predict``) cut it; errors are ``{"error": "..."}`` with a 4xx for a refusal.
"""

from __future__ import annotations

import json
from typing import Any

from corral.fuzz.dialects.base import (
    ERROR,
    LENGTH,
    OK,
    REASON_CHARS,
    REFUSED,
    Dialect,
    Reply,
    Sampling,
    error_text,
)


class Ollama(Dialect):
    name = "ollama"
    describe = "format: the schema, on /api/chat (Ollama)"
    path = "/api/chat"
    under_v1 = False
    models_path = "/api/tags"

    def first_model(self, doc: Any) -> str:
        return doc["models"][0]["name"]

    def body(self, model: str | None, messages: list[dict], schema: Any, s: Sampling) -> dict:
        options = {"temperature": s.temperature, "num_predict": s.max_tokens, "seed": s.seed}
        return {
            "model": model,
            "messages": messages,
            "format": schema,
            "stream": False,
            "options": options,
        }

    def read(self, status: int, text: str) -> Reply:
        if (why := self.refusal(status, text)) is not None:
            return Reply(REFUSED, why)
        if status != 200:
            return Reply(ERROR, f"HTTP {status}: {error_text(text)}")
        try:
            doc = json.loads(text)
            content = doc["message"]["content"]
        except (ValueError, KeyError, TypeError):
            return Reply(ERROR, f"not an Ollama chat reply: {text[:REASON_CHARS]}")
        if doc.get("done_reason") == "length":
            return Reply(LENGTH, "")
        return Reply(OK, content or "")
