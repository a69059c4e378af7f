"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS): keep generated requests cheap and
mostly servable.

Generated bodies keep everything else (random schemas, regexes, grammars, tools) but get at most
4 tokens per choice and at most two choices, so the run costs seconds of generation. The
request schema also holds fields whose every value (or every value but one) is refused by
design — OpenAI features Corral does not offer, a second constraint beside the first, options
that only take one value — and a random body sets several of them at once, so nearly every one
would be a 400 and the served paths would go untested. ``_servable`` repairs those fields (their
refusals are tested one by one in test_api_params.py); everything else stays as generated.
"""

from __future__ import annotations

import json

import schemathesis

MAX_TOKENS = 4
VOCAB = 49152  # SmolLM2's token ids
CONSTRAINTS = ("response_format", "guided_json", "guided_regex", "guided_choice",
               "guided_grammar", "regex", "json_schema", "ebnf", "structured_outputs")  # fmt: skip
SO_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")
ALWAYS_REFUSED = ("audio", "prediction", "web_search_options", "reasoning_effort", "verbosity",
                  "functions", "function_call", "suffix", "logit_bias", "guided_whitespace_pattern",
                  "prompt_cache_retention")  # fmt: skip
ONLY_VALUE = {"include_stop_str_in_output": False, "guided_decoding_backend": "auto",
              "store": False, "service_tier": "auto", "modalities": ["text"]}  # fmt: skip


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: /v1/responses: fields refused by design, and options that only take one value
RESPONSES_REFUSED = ("previous_response_id", "conversation", "prompt", "reasoning", "include",
                     "max_tool_calls", "top_logprobs", "prompt_cache_retention")  # fmt: skip
RESPONSES_ONLY = {"store": False, "background": False, "truncation": "disabled",
                  "service_tier": "auto"}  # fmt: skip


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path == "/v1/responses":
        _servable_response(body)
        return
    if case.path == "/generate":
        _servable_generate(body)
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if key in body and body[key] is None:  # null is "no limit": the whole context
            del body[key]
        if _is_int(body.get(key)) and body[key] > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS
    if _is_int(body.get("n")) and body["n"] > 2:
        body["n"] = 2
    _servable(body)
    if case.path.startswith("/v1/constraints") and not _constrained(body):
        body["response_format"] = {"type": "json_object"}  # these answer a constraint only


def _servable(body: dict) -> None:
    for key in ALWAYS_REFUSED:
        body.pop(key, None)
    for key, value in ONLY_VALUE.items():
        if key in body:
            body[key] = value
    if _is_int(body.get("min_tokens")) and body["min_tokens"] > MAX_TOKENS:
        body["min_tokens"] = MAX_TOKENS
    if isinstance(body.get("stop_token_ids"), list):
        body["stop_token_ids"] = [t % VOCAB if _is_int(t) else t for t in body["stop_token_ids"]]
    if "best_of" in body:
        body["best_of"] = body.get("n", 1)
    if body.get("echo") and body.get("logprobs") is not None:
        body.pop("echo")
    if not body.get("stream"):
        body.pop("stream_options", None)
    so = body.get("structured_outputs")
    if isinstance(so, dict):
        so.pop("structural_tag", None)
        so.pop("whitespace_pattern", None)
        _keep_first(so, SO_CONSTRAINTS)
    for key in ("guided_json", "json_schema"):
        if isinstance(body.get(key), str) and not _is_json(body[key]):
            body[key] = "{}"
    tools_in_play = body.get("tools") and body.get("tool_choice") != "none"
    _keep_first(body, () if tools_in_play else CONSTRAINTS, drop=CONSTRAINTS)


def _constrained(body: dict) -> bool:
    tools = body.get("tools") and body.get("tool_choice") != "none"
    return bool(tools) or any(body.get(k) not in (None, False) for k in CONSTRAINTS)


def _servable_response(body: dict) -> None:
    if not (_is_int(body.get("max_output_tokens")) and body["max_output_tokens"] <= MAX_TOKENS):
        body["max_output_tokens"] = MAX_TOKENS
    for key in RESPONSES_REFUSED:
        body.pop(key, None)
    for key, value in RESPONSES_ONLY.items():
        if key in body:
            body[key] = value
    if not body.get("stream"):
        body.pop("stream_options", None)


#: /generate: SGLang's constraint fields, and options that only take one value
GENERATE_CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")
GENERATE_ONLY = {"spaces_between_special_tokens": True, "no_stop_trim": False}


def _servable_generate(body: dict) -> None:
    """At most 4 prompts of at most 4 new tokens and 2 choices each; one constraint."""
    for key in ("text", "input_ids"):
        if isinstance(body.get(key), list) and body[key] and isinstance(body[key][0], str | list):
            body[key] = body[key][:4]
    params = body.get("sampling_params")
    for sp in params if isinstance(params, list) else [params]:
        if not isinstance(sp, dict):
            continue
        if not (_is_int(sp.get("max_new_tokens")) and sp["max_new_tokens"] <= MAX_TOKENS):
            sp["max_new_tokens"] = MAX_TOKENS
        if _is_int(sp.get("min_new_tokens")) and sp["min_new_tokens"] > MAX_TOKENS:
            sp["min_new_tokens"] = MAX_TOKENS
        if _is_int(sp.get("n")) and sp["n"] > 2:
            sp["n"] = 2
        sp.pop("stop_regex", None)
        for key, value in GENERATE_ONLY.items():
            if key in sp:
                sp[key] = value
        if isinstance(sp.get("json_schema"), str) and not _is_json(sp["json_schema"]):
            sp["json_schema"] = "{}"
        _keep_first(sp, GENERATE_CONSTRAINTS)
    if "sampling_params" not in body:
        body["sampling_params"] = {"max_new_tokens": MAX_TOKENS}


def _keep_first(body: dict, keys: tuple[str, ...], drop: tuple[str, ...] = ()) -> None:
    """Keep the first of ``keys`` that constrains the output; remove the others (and ``drop``)."""
    kept = False
    for key in dict.fromkeys(keys + drop):
        value = body.get(key)
        text_format = isinstance(value, dict) and value.get("type") == "text"
        if value in (None, False) or text_format:
            continue
        if kept or key not in keys:
            del body[key]
        else:
            kept = True


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True
