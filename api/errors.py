"""The one place where exceptions become OpenAI-shaped error responses.

Client mistakes are typed (``ApiError``, ``ConstraintError``, the engine's ``RequestError``,
pydantic validation errors) and map to 4xx with ``{"error": {"message", "type", "param",
"code"}}``. The server's own temporary trouble is typed too (``CompileUnavailable``, the
engine's ``EngineUnavailable``): a 503 with ``Retry-After``. Anything else is a server bug: a
500, logged with its traceback. (How a generation that started ends is ``outcomes``' job.)
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.api.responses import ApiJSONResponse
from corral.api.sse import DONE, data_event
from corral.engine.serving.async_engine import EngineUnavailable
from corral.engine.serving.core import RequestError
from corral.grammar import CompileUnavailable, ConstraintError

log = logging.getLogger("corral.api")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
#: the ``code`` of errors Starlette raises itself (routing, body parsing), by status
_HTTP_CODES = {400: "invalid_value", 404: "not_found", 405: "method_not_allowed",
               413: "request_too_large"}  # fmt: skip


class ApiError(Exception):
    """An error response: status, OpenAI error fields and extra headers (e.g. Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error | self.extra}

    def response(self) -> JSONResponse:
        return ApiJSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def constraint_error(e: ConstraintError, param: str, pointer: str | None = None) -> ApiError:
    """A constraint the client sent that cannot be compiled or enforced exactly: a 400.

    ``pointer`` overrides ``e.pointer`` when the caller has mapped it back onto the schema the
    client wrote (tools are compiled as one combined schema).
    A constraint refused because it would exceed a bound (``e.limit``: a backend limit found at
    compile time, or one of the server's limits) has code ``constraint_too_complex`` and names
    the bound in the extra field ``limit``.
    """
    pointer = e.pointer if pointer is None else pointer
    where = f" (at {pointer or '/'}" + (f", keyword '{e.keyword}'" if e.keyword else "") + ")"
    limit = getattr(e, "limit", None)
    extra: dict[str, Any] = {"pointer": pointer, "keyword": e.keyword}
    if limit:
        extra["limit"] = limit
    return ApiError(
        400,
        f"{param}: {e.reason}{where}",
        param=param,
        code="constraint_too_complex" if limit else "invalid_constraint",
        extra=extra,
    )


def model_not_found(model: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"the model '{model}' does not exist; this server serves '{served}' (see GET /v1/models)",
        param="model",
        code="model_not_found",
    )


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "missing or incorrect API key: send the header 'Authorization: Bearer <key>'",
        code="invalid_api_key",
    )


def queue_full(retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        "the server is at its request limit (running + queued); retry after a short wait",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )


def request_too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than this server accepts ({max_bytes} bytes; "
        "see --max-body-bytes)",
        code="request_too_large",
    )


def unavailable(message: str, code: str, retry_after_s: float) -> ApiError:
    """A 503: the server cannot serve this now, and says when to retry."""
    return ApiError(
        503,
        message,
        type=SERVER_ERROR,
        code=code,
        headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))},
    )


def _typed(exc: BaseException) -> ApiError | None:
    """The response a typed exception stands for; None for an untyped one (a server bug)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ConstraintError):
        return constraint_error(exc, "response_format")
    if isinstance(exc, RequestError):
        return bad_request(str(exc), code="invalid_value")
    if isinstance(exc, CompileUnavailable):
        return unavailable(f"the constraint could not be compiled now: {exc.reason}",
                           exc.code, exc.retry_after_s)  # fmt: skip
    if isinstance(exc, EngineUnavailable):  # restarting, or down (EngineDeadError)
        return unavailable(f"the engine cannot take requests now: {exc}", "engine_unavailable",
                           getattr(exc, "retry_after_s", 1))  # fmt: skip
    return None


def as_api_error(exc: BaseException) -> ApiError:
    """The error response for any exception; an untyped one is a logged 500 (a server bug)."""
    typed = _typed(exc)
    if typed is not None:
        return typed
    log.error("unhandled error", exc_info=exc)
    return ApiError(500, "internal server error (a bug; see the server log)", type=SERVER_ERROR)


def status_of(exc: BaseException) -> int:
    """The status ``as_api_error`` gives ``exc`` (without logging it)."""
    typed = _typed(exc)
    return 500 if typed is None else typed.status


def error_events(exc: BaseException) -> list[str]:
    """An error after a stream has started: the OpenAI error body as an event, then [DONE]."""
    return [data_event(json.dumps(as_api_error(exc).body())), DONE]


def _validation_param(loc: tuple[Any, ...], body: Any, missing: bool) -> str | None:
    """``("body", "messages", 0, "user", "content")`` -> ``"messages[0].content"``.

    The path is walked alongside the request body, and only parts found in it are kept:
    pydantic also puts union tags (a message's ``role``, a format's ``type``, ``str`` or
    ``list[...]`` for plain unions) into the path. A ``missing`` field's name is kept.
    """
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    text, node = "", body
    for i, part in enumerate(parts):
        found = isinstance(node, dict | list) and _has(node, part)
        if not found and not (missing and i == len(parts) - 1):
            continue  # a union tag, not a field
        text += f"[{part}]" if isinstance(part, int) else ("." if text else "") + str(part)
        node = node[part] if found else None
    return text or None


def _has(node: dict | list, part: Any) -> bool:
    if isinstance(node, dict):
        return part in node
    return isinstance(part, int) and 0 <= part < len(node)


def _validation_error(exc: RequestValidationError) -> ApiError:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request body"}
    param = _validation_param(tuple(first.get("loc", ())), exc.body, first.get("type") == "missing")
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        msg = "the request body is not valid JSON"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    code = "unknown_parameter" if first.get("type") == "unknown_parameter" else "invalid_value"
    return bad_request(f"{param + ': ' if param else ''}{msg}{more}", param=param, code=code)


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping; every handler returns the OpenAI error shape."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    async def _mapped(_: Request, exc: Exception) -> JSONResponse:
        return as_api_error(exc).response()

    for typed in (ConstraintError, RequestError, CompileUnavailable, EngineUnavailable):
        app.add_exception_handler(typed, _mapped)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Corral's own handlers raise ApiError; an HTTPException 400 is FastAPI's answer to a
        # body it could not parse (bad bytes, JSON nested past Python's recursion limit)
        detail = str(exc.detail)
        if exc.status_code == 400:
            detail = "the request body could not be parsed as JSON (invalid, or nested too deeply)"
        code = _HTTP_CODES.get(exc.status_code)
        return ApiError(exc.status_code, detail, code=code, headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path)
        # a 500 is sent outside the app's middleware, so it is counted here
        state = getattr(request.app.state, "corral", None)
        if state is not None:
            route = getattr(request.scope.get("route"), "path", "other")
            state.metrics.requests.labels(endpoint=route, status="500").inc()
        return as_api_error(exc).response()
