"""Shared request checks: the model name, the context length and the engine's SamplingParams.

OpenAI's sampling fields keep OpenAI's meaning; vLLM's and SGLang's extensions keep theirs:
``top_k`` (0 or -1: off), ``min_p``, ``repetition_penalty`` (1: off; seen tokens' logits are
divided by it when positive, multiplied when negative), ``min_tokens`` (no EOS or stop before
that many tokens), ``ignore_eos``, ``stop_token_ids`` and ``skip_special_tokens``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from corral.api.errors import bad_request, model_not_found
from corral.api.limits import check_n
from corral.api.protocol import ChatCompletionRequest
from corral.api.responses import SpeculativeUsage, Usage
from corral.api.state import ServerState
from corral.engine.serving.core import BudgetReport, RequestError, SamplingParams
from corral.grammar import ConstraintSpec


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
    check_n(req.n, state.config)
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
            **_extensions(state, req, budget),
        )
    except RequestError as e:
        raise bad_request(str(e), code="invalid_value") from e


def _extensions(state: ServerState, req: Any, budget: int) -> dict[str, Any]:
    """vLLM's and SGLang's sampling fields as SamplingParams keywords (their meaning there)."""
    if req.min_tokens > budget:
        raise bad_request(
            f"min_tokens is {req.min_tokens}, but at most {budget} tokens can be generated "
            "(max_tokens, or what the context leaves); lower min_tokens",
            param="min_tokens",
            code="invalid_value",
        )
    vocab = len(state.tokenizer)
    for i, token in enumerate(req.stop_token_ids or ()):
        if token >= vocab:
            raise bad_request(
                f"stop_token_ids[{i}] is {token}, but this model's token ids are below {vocab}",
                param=f"stop_token_ids[{i}]",
                code="invalid_value",
            )
    return {
        "top_k": max(req.top_k or 0, 0),  # vLLM: 0 or -1 switch it off
        "min_p": req.min_p or 0.0,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "min_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos,
        "stop_token_ids": tuple(req.stop_token_ids or ()),
        "skip_special_tokens": req.skip_special_tokens,
        "speculative": req.speculative,
    }


def with_budget_close(
    state: ServerState, params: SamplingParams, req: Any, spec: ConstraintSpec | None
) -> SamplingParams:
    """`params` with budget closing (`engine.budget_close`) for a json_schema / json_object
    constraint and for tool calls / structural tags (`grammar.tag_close`), unless the request
    opted out (``"budget_close": false``). Not after a reasoning block. The closer is the
    server's (``state.runtime``: one per constraint, built once); building it runs the schema
    analysis: call this off the event loop."""
    if not req.budget_close or spec is None:
        return params
    close = state.runtime.budget_close(spec)
    return params if close is None else replace(params, budget_close=close)


def budget_json(report: BudgetReport | None) -> dict[str, Any] | None:
    """A choice's ``budget_close`` extension field."""
    if report is None:
        return None
    out: dict[str, Any] = {"steered": report.steered, "cut_short": list(report.cut_short)}
    out["complete"] = report.complete
    if report.reason:
        out["reason"] = report.reason
    return out


def usage(call: Any) -> Usage:
    """Token counts of a finished (or aborted) call."""
    return Usage(
        prompt_tokens=call.num_prompt_tokens,
        completion_tokens=call.num_output_tokens,
        total_tokens=call.num_prompt_tokens + call.num_output_tokens,
        prompt_tokens_details={"cached_tokens": call.num_cached_tokens},
        speculative=speculative_usage([call]),
    )


def speculative_usage(calls: list[Any]) -> SpeculativeUsage | None:
    """The ``usage.speculative`` extension: lookup draft tokens proposed and accepted over
    ``calls``' choices; absent when none were proposed."""
    proposed = sum(c.spec_proposed for c in calls)
    if not proposed:
        return None
    accepted = sum(c.spec_accepted for c in calls)
    return SpeculativeUsage(
        proposed_tokens=proposed, accepted_tokens=accepted, acceptance_rate=accepted / proposed
    )
