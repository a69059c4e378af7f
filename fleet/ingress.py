"""Ingress: the fleet's HTTP entry, a thin ASGI relay in front of the replicas.

Ray Serve's HTTP proxy streams a request's body to the replica it picked, after picking it, so
a router behind the proxy never sees the prompt. The ingress therefore reads the body first and
calls the replicas' deployment handle with (scope, body): Ray Serve's router (``CorralRouter``)
chooses the replica from both, and the replica's ASGI messages are relayed back unchanged.

The ingress reads at most ``max_body_bytes + 1`` bytes: the replica's own body limit then
answers the 413 it would answer alone, without the ingress buffering an oversized body.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from corral.api.errors import unavailable

log = logging.getLogger("corral.fleet")
# The parts of an HTTP scope a replica needs (the rest is the ingress's own server state).
_SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path",
               "root_path", "query_string", "headers", "client", "server")  # fmt: skip


class Ingress:
    """Reads each request's body, then streams the chosen replica's answer back."""

    def __init__(self, replicas: Any, max_body_bytes: int) -> None:
        """``replicas``: the ``DeploymentHandle`` of the ``Replica`` deployment."""
        self._replicas = replicas.options(method_name="asgi", stream=True)
        self._max_body_bytes = max_body_bytes

    def __serve_build_asgi_app__(self) -> Any:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            # a plain coroutine function: uvicorn takes a bound method for an ASGI2 app
            await self._asgi(scope, receive, send)

        return app

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await self._read_body(receive)
        if body is None:
            return  # the client left before it finished sending
        call = self._replicas.remote({k: scope[k] for k in _SCOPE_KEYS if k in scope}, body)
        started = False
        try:
            async for message in call:
                started = started or message["type"] == "http.response.start"
                await send(message)
        except asyncio.CancelledError:  # the client left: the replica aborts its request
            call.cancel()
            raise
        except Exception as exc:  # the replica died, or could not be reached
            if started:
                raise  # mid-stream: the connection breaks, as a crashed server's would
            log.warning("replica call failed before it answered: %r", exc)
            refusal = unavailable(
                "the replica serving this request failed; retry", "replica_unavailable", 1
            )
            await refusal.response()(scope, receive, send)

    async def _read_body(self, receive: Any) -> bytes | None:
        body = bytearray()
        while len(body) <= self._max_body_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        return bytes(body)


async def _lifespan(receive: Any, send: Any) -> None:
    """The ingress holds nothing that needs starting or stopping."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
