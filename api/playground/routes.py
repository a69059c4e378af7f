"""GET ``/`` (the page), ``/playground/<file>`` (its scripts and style) and
``/playground/config.json`` (what the page must know before its first API call)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from corral.api.errors import ApiError

#: the page's files and their media types; nothing else is served from the package
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
    "main.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "editor.js": "text/javascript; charset=utf-8",
    "examples.js": "text/javascript; charset=utf-8",
    "pointers.js": "text/javascript; charset=utf-8",
    "schema_check.js": "text/javascript; charset=utf-8",
    "generate.js": "text/javascript; charset=utf-8",
    "tokens.js": "text/javascript; charset=utf-8",
    "metrics.js": "text/javascript; charset=utf-8",
}
#: same origin only; no inline script, no eval, nothing from elsewhere
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _read_assets() -> dict[str, bytes]:
    here = files(__package__)
    return {name: here.joinpath(name).read_bytes() for name in ASSETS}


def add_playground_routes(app: FastAPI) -> None:
    """Serve the page from files read now (a missing file fails the server's start)."""
    assets = _read_assets()

    def asset(name: str) -> Response:
        return Response(assets[name], media_type=ASSETS[name], headers=_HEADERS)

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return asset("index.html")

    @app.get("/playground/config.json", include_in_schema=False)
    async def config(request: Request) -> JSONResponse:
        state = request.app.state.corral
        return JSONResponse({"api_key_required": state.config.api_key is not None})

    @app.get("/playground/{name}", include_in_schema=False)
    async def playground_file(name: str) -> Response:
        if name not in ASSETS or name == "index.html":
            raise ApiError(404, f"no playground file {name!r}", code="not_found")
        return asset(name)
