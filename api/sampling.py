"""Shared request checks: the model name, the context length and the engine's SamplingParams."""

from __future__ import annotations

from typing import Any

from corral.api.errors import bad_request, model_not_found
from corral.api.protocol import ChatCompletionRequest
from corral.api.responses import Usage
from corral.api.state import ServerState
from corral.engine.core import RequestError, SamplingParams


def check_model(state: ServerState, model: str) -> None:
    """404 unless ``model`` is the served model's id."""
    if model != state.model_name:
        raise model_not_found(model, state.model_name)


def token_budget(
    state: ServerState, num_prompt: int, max_tokens: int | None, param: str, prompt_param: str
) -> int:
    """max_tokens checked against the context and the KV cache; unset means all that is left."""
    limit = min(state.context_length, state.kv_capacity)
    what = (
        f"this model's context is {state.context_length} tokens"
        if limit == state.context_length
        else f"the server's KV cache holds {limit} tokens (start it with more --memory)"
    )
    room = limit - num_prompt
    if room < 1:
        raise bad_request(
            f"the prompt is {num_prompt} tokens, but {what}; shorten the prompt",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise bad_request(
            f"{param} is {max_tokens}, but the prompt is {num_prompt} tokens and {what}: "
            f"at most {room} tokens can be generated; lower {param}",
            param=param,
            code="context_length_exceeded",
        )
    return max_tokens


def sampling_params(
    state: ServerState, req: Any, num_prompt: int, max_tokens: int | None, stops: list[str]
) -> SamplingParams:
    """The engine's SamplingParams for an OpenAI request (OpenAI's defaults where unset)."""
    chat = isinstance(req, ChatCompletionRequest)
    param = "max_completion_tokens" if chat and req.max_completion_tokens else "max_tokens"
    budget = token_budget(state, num_prompt, max_tokens, param, "messages" if chat else "prompt")
    if chat:  # logprobs: bool, top_logprobs: int
        wants_logprobs, top = req.logprobs, req.top_logprobs or 0
    else:  # logprobs: int | None, the number of alternatives
        wants_logprobs, top = req.logprobs is not None, req.logprobs or 0
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if top_p == 0:  # only the most likely token: greedy (the engine wants top_p in (0, 1])
        temperature, top_p = 0.0, 1.0
    try:
        return SamplingParams(
            max_tokens=budget,
            temperature=temperature,
            top_p=top_p,
            seed=req.seed,
            stop=tuple(stops),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logprobs=wants_logprobs,
            top_logprobs=top,
            n=req.n,
        )
    except RequestError as e:
        raise bad_request(str(e)) from e


def usage(call: Any) -> Usage:
    """Token counts of a finished (or aborted) call."""
    return Usage(
        prompt_tokens=call.num_prompt_tokens,
        completion_tokens=call.num_output_tokens,
        total_tokens=call.num_prompt_tokens + call.num_output_tokens,
        prompt_tokens_details={"cached_tokens": call.num_cached_tokens},
    )
