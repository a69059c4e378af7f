"""SGLang's native HTTP API beside the OpenAI one: ``POST /generate`` (``serving_generate``),
``GET /get_model_info``, ``GET /get_server_info``, ``GET /health_generate``,
``POST /flush_cache`` and ``POST /concate_and_append_request`` (accepted; nothing spliced). Same API key, limits and error mapping as the ``/v1`` endpoints.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from corral import __version__
from corral.api.engine_call import EngineCall, require_engine
from corral.api.errors import unavailable
from corral.api.messages import _Closed
from corral.api.protocol_generate import GenerateRequest
from corral.api.serving_generate import create_generate
from corral.api.state import ServerState
from corral.engine.serving.core import SamplingParams

HEALTH_GENERATE_TIMEOUT_S = 20.0


def add_native_routes(
    app: FastAPI, dependencies: list[Any], state_of: Callable[[Request], ServerState]
) -> None:
    """Register SGLang's endpoints on ``app`` behind ``dependencies`` (the API key check)."""

    @app.post("/generate", dependencies=dependencies, response_model=None)
    async def generate(body: GenerateRequest, request: Request) -> Response:
        """SGLang's ``/generate``: text or input_ids (one or a batch), sampling_params with
        regex / json_schema / ebnf / structural_tag constraints, logprobs, SSE streaming."""
        return await create_generate(state_of(request), body, request)

    @app.get("/get_model_info", dependencies=dependencies)
    async def get_model_info(request: Request) -> JSONResponse:
        state = state_of(request)
        return JSONResponse(_model_info(state))

    @app.get("/get_server_info", dependencies=dependencies)
    async def get_server_info(request: Request) -> JSONResponse:
        state = state_of(request)
        stats = state.engine.stats()
        body = {
            **_model_info(state),
            "version": __version__,
            "server": "corral",
            "served_model_name": state.model_name,
            "context_length": state.context_length,
            "max_total_num_tokens": state.kv_capacity,
            "max_running_requests": state.config.max_concurrent,
            "internal_states": [{"engine": state.engine.health(), **stats}],
        }
        return JSONResponse(body)

    @app.get("/health_generate", dependencies=dependencies, response_class=Response)
    async def health_generate(request: Request) -> Response:
        """200 once the engine has generated one token now; 503 (with Retry-After) when it
        cannot serve or did not within the timeout."""
        state = state_of(request)
        require_engine(state)
        try:
            await asyncio.wait_for(_one_token(state), HEALTH_GENERATE_TIMEOUT_S)
        except TimeoutError:
            raise unavailable("the engine generated nothing within "
                              f"{HEALTH_GENERATE_TIMEOUT_S:g} s", "engine_busy", 1) from None  # fmt: skip
        return Response(status_code=200)

    @app.post("/concate_and_append_request", dependencies=dependencies)
    async def concat_and_append(body: ConcatRequest) -> JSONResponse:
        """SGLang's parallel encoding would splice the branches' KV (computed at other
        positions, so not the model's exact KV) behind the joined text. Corral keeps exact KV:
        nothing is spliced, and the program's next request, which carries the joined text,
        reuses whatever prefix of it the radix cache holds. The answer says so."""
        return JSONResponse({"success": True, "concatenated": False,
                             "message": "exact KV only: the joined text is prefilled by the "
                             "next request that carries it"})  # fmt: skip

    @app.post("/flush_cache", dependencies=dependencies, response_class=PlainTextResponse)
    async def flush_cache(request: Request) -> PlainTextResponse:
        """Drop every prefix-cache entry no running request holds (those in use stay)."""
        state = state_of(request)
        require_engine(state)
        freed = await state.engine.flush_cache()
        return PlainTextResponse(f"Cache flushed: {freed} tokens freed.\n")


class ConcatRequest(_Closed):
    """SGLang's ``/concate_and_append_request`` body (what ``fork(...).join
    ("concate_and_append")`` sends after appending the branches' text itself)."""

    src_rids: list[str]
    dst_rid: str


def _model_info(state: ServerState) -> dict[str, Any]:
    return {
        "model_path": state.config.model or state.model_name,
        "tokenizer_path": state.config.model or state.model_name,
        "served_model_name": state.model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }


async def _one_token(state: ServerState) -> None:
    started = time.monotonic()
    prompt = [int(state.tokenizer.eos_token_id or 0)]
    call = EngineCall(state, prompt, SamplingParams(max_tokens=1, temperature=0), None,
                      arrival=started)  # fmt: skip
    try:
        async for _ in call.outputs():
            pass
    finally:
        await call.close()
