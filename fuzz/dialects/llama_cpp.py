"""llama.cpp's servers: llama-cpp-python's (``llama_cpp.server``) and llama-server (C++).

llama-cpp-python takes a schema as ``response_format: {"type": "json_object", "schema": ...}``
and refuses OpenAI's ``json_schema`` type. It reports a request it cannot parse as an HTTP 500
whose message is FastAPI's list of validation errors (every exception in a route becomes a 500
there), so that shape counts as a refusal. A schema its converter cannot turn into a grammar
is not refused: the server silently falls back to any JSON, which the judge then catches.

llama-server also takes a top-level ``json_schema`` field (dialect ``llama-server``) and refuses
with an OpenAI-style 4xx.
"""

from __future__ import annotations

from typing import Any

from corral.fuzz.dialects.base import ChatCompletions, error_text

#: FastAPI's RequestValidationError as text: a list of errors whose ``loc`` starts at the body.
_VALIDATION = "'loc': ('body',"


class LlamaCppPython(ChatCompletions):
    name = "llama-cpp"
    describe = "response_format json_object with the schema beside it (llama-cpp-python)"
    hint_markers = ("'json_object'", '"json_object"')

    def constraint(self, schema: Any) -> dict[str, Any]:
        return {"response_format": {"type": "json_object", "schema": schema}}

    def refusal(self, status: int, text: str) -> str | None:
        if status == 500 and _VALIDATION in text:
            return f"HTTP 500, a request validation error: {error_text(text)}"
        return super().refusal(status, text)


class LlamaServer(ChatCompletions):
    name = "llama-server"
    describe = "the top-level json_schema field (llama.cpp's llama-server)"

    def constraint(self, schema: Any) -> dict[str, Any]:
        return {"json_schema": schema}
