"""Replica: one `corral serve` inside a Ray Serve replica, driven one ASGI request at a time.

Each replica builds the same ``ServerState`` and FastAPI app as `corral serve` (``api.server``,
``api.app``), runs the app's lifespan (which starts and stops the engine), and answers
``asgi(scope, body)`` calls from the ingress by running the app on that request and yielding
its ASGI messages. So every endpoint, status, error body and SSE stream is the single server's,
byte for byte; the replica only adds the ``X-Corral-Replica`` header that names it.

A caller that goes away cancels the call (Ray Serve cancels the replica's task); the app then
sees ``http.disconnect``, exactly as uvicorn reports a closed connection, and aborts the
engine request the way `corral serve` does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from corral.api.config import ServerConfig
from corral.fleet.affinity import REPLICA_HEADER

log = logging.getLogger("corral.fleet")
# How long an app whose client left may take to notice and abort before it is cancelled.
_DISCONNECT_GRACE_S = 5.0


class Replica:
    """A Corral server without a socket: the ingress hands it requests through Ray Serve."""

    async def __init__(self, config: ServerConfig) -> None:
        import uvicorn
        from ray import serve
        from uvicorn.lifespan.on import LifespanOn

        from corral.api.app import create_app
        from corral.api.server import build_state, startup_line
        from corral.base.heap import freeze_startup_heap

        self.name = serve.get_replica_context().replica_id.unique_id
        self.state = build_state(config)
        self.app = create_app(self.state)
        freeze_startup_heap()  # no full collection walks what start-up loaded (base/heap.py)
        self._lifespan = LifespanOn(
            uvicorn.Config(self.app, lifespan="on", log_config=None, access_log=False)
        )
        await self._lifespan.startup()
        if self._lifespan.should_exit:
            raise RuntimeError("the replica's engine did not start; see the log above")
        log.info("replica %s: %s", self.name, startup_line(self.state))

    async def asgi(self, scope: dict[str, Any], body: bytes) -> AsyncIterator[dict[str, Any]]:
        """Run the app on one HTTP request (its whole body already read) and yield the ASGI
        messages it sends, the response start carrying ``X-Corral-Replica``."""
        messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        left = asyncio.Event()
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    *message.get("headers", ()),
                    (REPLICA_HEADER.encode(), self.name.encode()),
                ]
                message = {**message, "headers": headers}
            await messages.put(message)

        task = asyncio.create_task(self.app(scope, receive, send))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        try:
            while (message := await messages.get()) is not None:
                yield message
            if not task.cancelled() and task.exception() is not None:
                # Starlette has sent its 500 already; the traceback belongs in this log.
                log.error("request failed in the app", exc_info=task.exception())
        finally:
            if not task.done():
                left.set()
                await asyncio.wait({task}, timeout=_DISCONNECT_GRACE_S)
                task.cancel()

    def check_health(self) -> None:
        """Ray Serve restarts a replica whose check fails: one whose engine is down for good
        (a restarting engine is left to finish its restart)."""
        status = self.state.engine.health()
        if status == "down":
            raise RuntimeError(f"replica {self.name}: the engine is down")

    async def __del__(self) -> None:
        lifespan = getattr(self, "_lifespan", None)  # absent when __init__ failed
        if lifespan is not None:
            await lifespan.shutdown()
