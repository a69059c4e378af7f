"""OpenAI's structured outputs: ``response_format`` of type ``json_schema``, strict.

Corral, vLLM, SGLang, Ollama's ``/v1`` and OpenAI itself take it; the content is judged.
"""

from __future__ import annotations

from typing import Any

from corral.fuzz.dialects.base import ChatCompletions


class OpenAIJsonSchema(ChatCompletions):
    name = "openai"
    describe = "response_format json_schema, strict true"
    hint_markers = ("json_schema",)

    def constraint(self, schema: Any) -> dict[str, Any]:
        rf = {
            "type": "json_schema",
            "json_schema": {"name": "fuzz", "schema": schema, "strict": True},
        }
        return {"response_format": rf}
