"""POST /v1/constraints/validate (dry run) and POST /v1/constraints (precompile).

Both take a chat request's body (``ConstraintRequest``: ``messages`` and ``model`` optional)
and run exactly the constraint path of ``/v1/chat/completions`` — the same request limits, the
same object closing and tool wrapping (``request_constraint.chat_constraint``), the same compile
service — without generating. A constraint Corral cannot enforce exactly is the 400 a chat
request would get (``param``, ``pointer``, ``keyword``); one it can is a 200 with its receipt.

Validating needs the compile (only the compiled grammar's probe knows whether a backend limit is
in the way), so a validated constraint is in the cache afterwards, like a precompiled one: the
two differ in intent, not in effect. A body without a constraint (no response format or only
``text``, no tools in play) is a 400: there is nothing to validate.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import Request
from pydantic import BaseModel

from corral.api.protocol import ConstraintRequest
from corral.api.receipts import enforce
from corral.api.request_constraint import required_constraint
from corral.api.request_params import check_model
from corral.api.responses import ApiJSONResponse, Receipt, dump
from corral.api.state import ServerState


class ConstraintReceipt(BaseModel):
    """The 200 of both endpoints: the receipt a generation request would carry."""

    object: Literal["constraint"] = "constraint"
    corral: Receipt


async def constraint_receipt(
    state: ServerState, req: ConstraintRequest, request: Request
) -> ApiJSONResponse:
    """Build and compile the request's constraint as a chat request would; answer its receipt.

    Takes a place in the server's admission like a generation request (a 429 when full): a
    compile is the costly part of one."""
    if req.model is not None:
        check_model(state, req.model)
    with state.admission.slot():
        tool_format = state.formatter.tool_format
        constraint = await asyncio.to_thread(
            required_constraint,
            req,
            state.config,
            tool_format,
            state.forms,
            state.formatter.reasoning,
        )
        done = await enforce(state, request, constraint)
    return ApiJSONResponse(dump(ConstraintReceipt(corral=done.receipt)))
