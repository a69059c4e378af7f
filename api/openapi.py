"""The OpenAPI document as this server really behaves (what FastAPI cannot infer by itself).

- Validation errors are documented as the 400 they are (never FastAPI's default 422).
- ``model`` is an enum of the one id this server answers to (others get a documented 404).
- Streaming answers are documented per event (``itemSchema``): each ``data`` is a JSON chunk, an
  error object, or the final ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from corral.api.responses import ChatCompletionChunk, Completion, ErrorResponse

_REF = "#/components/schemas/{model}"
_STREAMS = {"/v1/chat/completions": ChatCompletionChunk, "/v1/completions": Completion}


def build_openapi(app: FastAPI, served_model: str) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in (ChatCompletionChunk, Completion, ErrorResponse):
        _add_component(schemas, model)
    for path, item in doc.get("paths", {}).items():
        for op in item.values():
            _validation_is_400(op.get("responses", {}))
            if path in _STREAMS:
                ok = op["responses"]["200"].setdefault("content", {})
                ok["text/event-stream"] = _event_stream(_STREAMS[path].__name__)
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest"):
        model = schemas.get(name, {}).get("properties", {}).get("model")
        if model is not None:
            model["enum"] = [served_model]
    return doc


def _add_component(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template=_REF, mode="serialization")
    for name, sub in schema.pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    schemas.setdefault(model.__name__, schema)


def _validation_is_400(responses: dict[str, Any]) -> None:
    if responses.pop("422", None) is not None and "400" not in responses:
        responses["400"] = {
            "description": "invalid request",
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}
            },
        }


def _event_stream(chunk: str) -> dict[str, Any]:
    payload = {
        "anyOf": [{"$ref": _REF.format(model=chunk)}, {"$ref": _REF.format(model="ErrorResponse")}]
    }
    data = {
        "type": "string",
        "if": {"const": "[DONE]"},
        "else": {"contentMediaType": "application/json", "contentSchema": payload},
    }
    return {
        "itemSchema": {"type": "object", "required": ["data"], "properties": {"data": data}},
        "description": "with stream=true: server-sent events, `data: [DONE]` last",
    }
