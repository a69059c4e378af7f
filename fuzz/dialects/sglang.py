"""SGLang's native API: ``POST /generate`` with ``sampling_params.json_schema`` (the schema as
JSON text) and a plain-text prompt (the chat messages joined; no chat template is applied).

The answer is ``text``; ``meta_info.finish_reason.type`` is ``length`` when ``max_new_tokens``
cut it and ``abort`` when SGLang gave up on the request (an invalid grammar among the reasons),
which counts as a refusal, as does a 4xx.
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


class SglangNative(Dialect):
    name = "sglang"
    describe = "sampling_params.json_schema on /generate (SGLang's native API)"
    path = "/generate"
    under_v1 = False
    models_path = None  # /generate serves the one model the server runs

    def body(self, model: str | None, messages: list[dict], schema: Any, s: Sampling) -> dict:
        prompt = "\n\n".join(m["content"] for m in messages) + "\n"
        params = {
            "json_schema": json.dumps(schema),
            "temperature": s.temperature,
            "max_new_tokens": s.max_tokens,
        }
        return {"text": prompt, "sampling_params": params}

    def read(self, status: int, text: str) -> Reply:
        if (why := self.refusal(status, text)) is not None:
            return Reply(REFUSED, why)
        if status != 200:
            return Reply(ERROR, f"HTTP {status}: {error_text(text)}")
        try:
            doc = json.loads(text)
            out = doc["text"]
            finish = (doc.get("meta_info") or {}).get("finish_reason") or {}
        except (ValueError, KeyError, TypeError):
            return Reply(ERROR, f"not an SGLang /generate reply: {text[:REASON_CHARS]}")
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind == "length":
            return Reply(LENGTH, "")
        if kind == "abort":
            return Reply(REFUSED, f"aborted: {str(finish.get('message'))[:REASON_CHARS]}")
        return Reply(OK, out if isinstance(out, str) else "")
