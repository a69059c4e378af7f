"""create_app: the FastAPI application of one ServerState (routes, auth, errors, metrics).

Two pure ASGI middlewares wrap it: ``_BodyLimit`` refuses a body over ``max_body_bytes`` (413)
before it is read or parsed, ``_StatusCounter`` counts every response by route and status.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.api.errors import (
    install_error_handlers,
    model_not_found,
    request_too_large,
    unauthorized,
)
from corral.api.openapi import build_openapi
from corral.api.playground import add_playground_routes
from corral.api.protocol import ChatCompletionRequest, CompletionRequest, ConstraintRequest
from corral.api.protocol_responses import ResponsesRequest
from corral.api.responses import (
    ChatCompletion,
    Completion,
    ErrorResponse,
    ModelCard,
    ModelList,
    dump,
)
from corral.api.serving_chat import create_chat_completion
from corral.api.serving_completion import create_completion
from corral.api.serving_constraints import ConstraintReceipt, constraint_receipt
from corral.api.serving_native import add_native_routes
from corral.api.serving_responses import RESPONSE_DOC, create_response
from corral.api.state import ServerState

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "invalid request, schema or grammar"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    413: {"model": ErrorResponse, "description": "request body over the server's limit"},
    429: {"model": ErrorResponse, "description": "queue full; see Retry-After"},
    500: {"model": ErrorResponse, "description": "the generation failed (code names why)"},
    503: {"model": ErrorResponse, "description": "engine or compiler unavailable; Retry-After"},
}


def _state(request: Request) -> ServerState:
    return request.app.state.corral


def _check_key(request: Request) -> None:
    key = _state(request).config.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(
        token.strip().encode(), key.encode()
    ):
        raise unauthorized()


def create_app(state: ServerState) -> FastAPI:
    """The OpenAI-compatible app; the engine starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.engine.start()
        on_ready = getattr(app.state, "on_ready", None)
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await state.engine.stop()
            for close in state.extra_shutdown:
                close()

    app = FastAPI(title="Corral", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.corral = state
    install_error_handlers(app)
    app.add_middleware(_BodyLimit, max_bytes=state.config.max_body_bytes)
    app.add_middleware(_StatusCounter, state=state)  # outermost: counts the 413s too
    _add_routes(app)
    add_playground_routes(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _add_routes(app: FastAPI) -> None:
    v1 = [Depends(_check_key)]

    @app.post(
        "/v1/chat/completions",
        dependencies=v1,
        response_model=None,
        responses={200: {"model": ChatCompletion}, **_ERRORS},
    )
    async def chat(
        body: ChatCompletionRequest, request: Request
    ) -> JSONResponse | StreamingResponse:
        return await create_chat_completion(_state(request), body, request)

    @app.post(
        "/v1/completions",
        dependencies=v1,
        response_model=None,
        responses={200: {"model": Completion}, **_ERRORS},
    )
    async def completions(
        body: CompletionRequest, request: Request
    ) -> JSONResponse | StreamingResponse:
        return await create_completion(_state(request), body, request)

    @app.post(
        "/v1/responses",
        dependencies=v1,
        response_model=None,
        responses={**_ERRORS, 200: RESPONSE_DOC},
    )
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        return await create_response(_state(request), body, request)

    @app.post(
        "/v1/constraints/validate",
        dependencies=v1,
        response_model=ConstraintReceipt,
        responses=_ERRORS,
    )
    async def validate_constraint(body: ConstraintRequest, request: Request) -> JSONResponse:
        """Dry run: whether Corral enforces this request's constraint exactly (its receipt) or
        the 400 a chat request with it would get; nothing is generated."""
        return await constraint_receipt(_state(request), body, request)

    @app.post(
        "/v1/constraints", dependencies=v1, response_model=ConstraintReceipt, responses=_ERRORS
    )
    async def precompile_constraint(body: ConstraintRequest, request: Request) -> JSONResponse:
        """Compile this request's constraint into the server's cache, as a chat request would."""
        return await constraint_receipt(_state(request), body, request)

    @app.get("/v1/models", dependencies=v1, response_model=ModelList, responses={401: _ERRORS[401]})
    async def models(request: Request) -> JSONResponse:
        return JSONResponse(dump(ModelList(data=[_card(_state(request))])))

    @app.get("/v1/models/{model}", dependencies=v1, response_model=ModelCard, responses=_ERRORS)
    async def model(model: str, request: Request) -> JSONResponse:
        state = _state(request)
        if model != state.model_name:
            raise model_not_found(model, state.model_name)
        return JSONResponse(dump(_card(state)))

    @app.get("/health", responses={503: {"description": "the engine cannot serve now"}})
    async def health(request: Request) -> JSONResponse:
        """200 ``{"status": "ok"}`` only while the engine can serve; else 503 with its state
        ("starting", "restarting" or "down"). Serving without a part that is configured but
        down (the Redis cache tier) is 200 ``{"status": "degraded", "degraded": {part: why}}``."""
        state = _state(request)
        status = state.engine.health()
        body: dict[str, Any] = {"status": status, "model": state.model_name}
        if status == "ok":
            degraded = state.degraded()
            if degraded:
                body.update(status="degraded", degraded=degraded)
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    @app.get("/metrics", response_class=Response)
    async def metrics(request: Request) -> Response:
        body = _state(request).metrics.render()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    add_native_routes(app, v1, _state)  # SGLang's /generate and friends


def _card(state: ServerState) -> ModelCard:
    return ModelCard(
        id=state.model_name, created=state.created, context_length=state.context_length
    )


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        app.openapi_schema = build_openapi(app, app.state.corral.model_name)
    return app.openapi_schema


class _StatusCounter:
    """Pure ASGI middleware: counts every HTTP response by route and status code."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                endpoint = getattr(route, "path", "other")
                self.state.metrics.requests.labels(
                    endpoint=endpoint, status=str(message["status"])
                ).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


# Closing the connection after a 413 stops a client that is still uploading the rest of the
# body (clients read the early response when their next write fails).
_CLOSE = {"Connection": "close"}


class _TooLarge(StarletteHTTPException):
    """Raised from ``receive`` when a body without Content-Length outgrows the limit: FastAPI
    passes an HTTPException through its body parsing, and the error handlers answer 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, request_too_large(max_bytes).message, headers=_CLOSE)


class _BodyLimit:
    """Pure ASGI middleware: a body over ``max_bytes`` is refused with a 413 before it is read.

    A declared Content-Length over the limit is answered at once, without reading a byte; a
    chunked body is counted as it arrives and refused as soon as it passes the limit.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            refusal = request_too_large(self.max_bytes)
            refusal.headers.update(_CLOSE)
            await refusal.response()(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
