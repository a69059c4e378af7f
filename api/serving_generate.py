"""POST /generate: SGLang's native generation endpoint, what its frontend (``sglang.lang``,
``RuntimeEndpoint``) and its users' scripts speak.

Each item of the body (``protocol_generate``) runs as the completions request it means: the
same constraint path (``request_constraint.completion_constraint``: the limits, the dialect
fields, the compile service and its cache), the same sampling checks
(``request_params.sampling_params``), admission, engine calls and failure semantics
(``engine_call``, ``errors``, ``outcomes``) as ``/v1/completions``. What differs is SGLang's:
``max_new_tokens: 0`` prefills and caches the prompt without generating (what ``fork`` and
``select`` send first), prompt logprobs from ``logprob_start_len``, and the response shapes
(``generate_output``). A stream sends the cumulative ``text`` of a choice in each event, then
``data: [DONE]``; a failure after the first byte is an error event, then ``[DONE]``.

``logprob_start_len`` -1 (its default) means: no prompt logprobs, except for a prefill-only
request, which gets them from the first token (what the frontend's
``unconditional_likelihood_normalized`` reads). A start at the prompt's length gives none; past
it is a 400.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from corral.api.engine_call import (
    Admitted,
    EngineCall,
    close_all,
    framed_stream,
    merged,
    require_engine,
    watch_disconnect,
)
from corral.api.errors import ApiError, bad_request
from corral.api.generate_output import ChoiceState, TokenText
from corral.api.prompting import encode_prompt
from corral.api.protocol_generate import GenerateItem, GenerateRequest, renamed
from corral.api.receipts import enforce
from corral.api.request_constraint import completion_constraint
from corral.api.request_params import sampling_params, with_budget_close
from corral.api.responses import ApiJSONResponse
from corral.api.sse import data_event
from corral.api.state import ServerState
from corral.engine.serving.core import SamplingParams

ENDPOINT = "generate"


async def create_generate(
    state: ServerState, req: GenerateRequest, request: Request
) -> JSONResponse | StreamingResponse:
    arrival = time.monotonic()
    require_engine(state)
    with Admitted(state, ENDPOINT, arrival) as admitted:  # a 429 here, before any compile
        job = _Job(state, req, arrival)
        for item in req.items():
            await job.prepare(item, request)
        if req.stream:
            return admitted.stream(job.stream(admitted), job.calls)
        return await job.complete(request)


class _Job:
    """The engine calls of one /generate request and the choices they make."""

    def __init__(self, state: ServerState, req: GenerateRequest, arrival: float) -> None:
        self.state, self.req, self.arrival = state, req, arrival
        self.calls: list[EngineCall] = []
        self.choices: list[list[ChoiceState]] = []
        self.meta: list[dict[str, Any]] = []  # per call: the receipt and lenient report
        self.names = TokenText(state.tokenizer)

    async def prepare(self, item: GenerateItem, request: Request) -> None:
        """Tokenize, check and compile one item (its errors name the field SGLang's body
        spells), and make its engine call."""
        try:
            ids = await asyncio.to_thread(self._prompt_ids, item)
            creq = item.completion(self.state.model_name, ids)
            constraint = await asyncio.to_thread(
                completion_constraint, creq, self.state.config, self.state.forms
            )
            params = sampling_params(self.state, creq, len(ids), creq.max_tokens, creq.stop_list())
            params = self._native(params, item, ids)
            done = await enforce(self.state, request, constraint) if constraint else None
        except ApiError as e:
            raise _named(e, item) from None
        meta: dict[str, Any] = {}
        compiled = None
        if done is not None and not params.prefill_only:
            params = await asyncio.to_thread(
                with_budget_close, self.state, params, creq, constraint.spec
            )
            compiled = done.compiled
        if done is not None:
            meta["corral"] = done.receipt.model_dump(exclude_none=True)
            if done.unenforced:
                meta["unenforced"] = [u.model_dump(exclude_none=True) for u in done.unenforced]
        call = EngineCall(self.state, ids, params, compiled, arrival=self.arrival)
        rid = item.rid or call.request_id
        start = params.prompt_logprobs_from
        if item.return_logprob and start is None and item.logprob_start_len == len(ids):
            start = len(ids)  # asked from the end: an empty list
        self.calls.append(call)
        self.meta.append(meta)
        self.choices.append([
            ChoiceState(
                rid=rid if params.n == 1 else f"{rid}-{j}",
                max_new_tokens=item.sampling.max_new_tokens,
                logprobs=item.return_logprob,
                with_text=self.req.return_text_in_logprobs,
                top=item.top_logprobs_num if item.return_logprob else 0,
                prompt_ids=ids,
                input_start=start,
            )
            for j in range(params.n)
        ])  # fmt: skip

    def _prompt_ids(self, item: GenerateItem) -> list[int]:
        state = self.state
        limit = min(state.context_length, state.kv_capacity)
        if isinstance(item.prompt, str):
            ids = encode_prompt(state.formatter, item.prompt, item.param, limit)
        else:
            ids = list(item.prompt)
        if not ids:
            raise bad_request(f"{item.param}: a prompt must have at least one token", item.param)
        vocab = len(state.tokenizer)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(
                f"{item.param}: token id {bad} is not in this model's vocabulary [0, {vocab})",
                item.param,
            )
        return ids

    def _native(self, params: SamplingParams, item: GenerateItem, ids: list[int]) -> SamplingParams:
        """SGLang's own asks on top of the completions' sampling: prefill only, logprobs."""
        prefill_only = item.sampling.max_new_tokens == 0
        start = item.logprob_start_len if item.return_logprob else -1
        if start > len(ids):
            raise bad_request(
                f"logprob_start_len is {start}, but the prompt has {len(ids)} tokens; "
                f"send at most {len(ids)}",
                "logprob_start_len",
            )
        if start == -1 and item.return_logprob and prefill_only:
            start = 0
        return replace(
            params,
            max_tokens=0 if prefill_only else params.max_tokens,
            logprobs=item.return_logprob,
            top_logprobs=item.top_logprobs_num if item.return_logprob else 0,
            prompt_logprobs_from=start if 0 <= start < len(ids) else None,
        )

    def _body(self, k: int, j: int) -> dict[str, Any]:
        body = self.choices[k][j].body(self.names, self.arrival)
        body["meta_info"].update(self.meta[k])
        return body

    async def complete(self, request: Request) -> JSONResponse:
        watcher = asyncio.create_task(watch_disconnect(request, self.calls))
        try:
            async for k, out in merged(self.calls):
                self.choices[k][out.index].add(out)
        finally:
            watcher.cancel()
            await close_all(self.calls)
        bodies = [
            self._body(k, j) for k in range(len(self.calls)) for j in range(len(self.choices[k]))
        ]
        single = not self.req.is_batch and len(bodies) == 1
        return ApiJSONResponse(bodies[0] if single else bodies)

    def stream(self, admitted: Admitted) -> AsyncIterator[str]:
        return framed_stream(self._events(), self._close, admitted)

    async def _close(self) -> None:
        await close_all(self.calls)

    async def _events(self) -> AsyncIterator[str]:
        indexed = self.req.is_batch or len(self.choices[0]) > 1
        async for k, out in merged(self.calls):
            self.choices[k][out.index].add(out)
            body = self._body(k, out.index)
            if indexed:
                body["index"] = sum(len(c) for c in self.choices[:k]) + out.index
            yield data_event(json.dumps(body))


def _named(e: ApiError, item: GenerateItem) -> ApiError:
    """Errors of the completions path name its fields: name SGLang's."""
    if e.param and e.param.startswith("prompt"):
        e.param = item.param
        e.message = e.message.replace("prompt:", f"{item.param}:", 1)
        return e
    return renamed(e)
