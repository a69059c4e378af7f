"""How a choice ended, for the client: the one mapping from engine outcomes to the API.

Every endpoint maps an engine ``Output`` through this module, streamed or not:

==========================================  ==================================================
engine finish                               API
==========================================  ==================================================
``"stop"`` (grammar ended, EOS, a stop)     finish_reason ``"stop"`` (``"tool_calls"`` when
                                            the choice parsed as tool calls)
``"length"`` (max_tokens)                   finish_reason ``"length"``
``"error"`` with ``Output.error``           not a success: HTTP 500 ``server_error`` with
                                            ``code`` = the ``EngineFailure`` code (503 with
                                            ``Retry-After`` for ``engine_restarted``);
                                            streamed: an error event, then ``[DONE]``
``"abort"``                                 the engine aborts only for a caller that left, so
                                            a client sees it only when the server stops: 503
                                            ``engine_stopped``
==========================================  ==================================================

A request fails as a whole when any of its choices fails (``n > 1`` included): a truncated
choice must never pass as a finished one.
"""

from __future__ import annotations

import logging
from typing import Any

from corral.api.errors import ApiError

log = logging.getLogger("corral.api")

SERVER_ERROR = "server_error"
#: failure codes the server answers with 503 (retry later: the engine is coming back or going
#: away); every other failure code is a 500.
_UNAVAILABLE = {"engine_restarted": 1, "engine_stopped": 1}
_MESSAGES = {
    "constraint_failed": "the output could not be continued under its constraint",
    "sequence_failed": "the generation of this choice failed",
    "engine_restarted": "the engine failed and was restarted; retry the request",
    "engine_stopped": "the server is shutting down; the request was stopped",
}


class GenerationFailed(ApiError):
    """A choice ended without a valid result. Non-streamed: this 5xx; streamed: its error event.

    ``code`` is the engine's failure code (``constraint_failed``, ``sequence_failed``,
    ``engine_restarted``, ``engine_stopped``); ``detail`` the engine's message.
    """

    def __init__(self, code: str, detail: str) -> None:
        retry = _UNAVAILABLE.get(code)
        summary = _MESSAGES.get(code, "the generation failed")
        super().__init__(
            503 if retry is not None else 500,
            f"{summary} ({code}: {detail})" if detail else f"{summary} ({code})",
            type=SERVER_ERROR,
            code=code,
            headers={"Retry-After": str(retry)} if retry is not None else None,
        )
        self.detail = detail


def failure(out: Any) -> GenerationFailed | None:
    """The failure a finished engine output stands for; None for success or an unfinished one."""
    reason = out.finish_reason
    if reason in (None, "stop", "length"):
        return None
    if reason == "error":
        err = getattr(out, "error", None)
        if err is None:  # the contract says "error" carries one; fail closed if not
            return GenerationFailed("sequence_failed", "")
        return GenerationFailed(err.code, err.message)
    # "abort": this server aborts a request only when its client has left, or when it stops
    return GenerationFailed("engine_stopped", "")


def finish_reason(engine_reason: str, tool_calls: bool = False) -> str:
    """The OpenAI finish reason of a choice that ended well ("stop" or "length").

    Failures ("error", "abort") have no finish reason: they are raised (see :func:`failure`)
    before a choice could be reported with one.
    """
    if tool_calls:
        return "tool_calls"
    if engine_reason == "length":
        return "length"
    if engine_reason == "stop":
        return "stop"
    raise ValueError(f"finish reason {engine_reason!r} is a failure, not a finish reason")


def record_failure(metrics: Any, request_id: str, exc: GenerationFailed) -> None:
    """Count a failed generation by its code and log it (never silent)."""
    metrics.failures.labels(code=exc.code).inc()
    log.warning("request %s failed: %s: %s", request_id, exc.code, exc.detail or exc.message)
