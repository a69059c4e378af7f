"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS): keep generated requests cheap.

Generated bodies keep everything else (random schemas, regexes, grammars, tools) but get at most
4 tokens per choice and at most two choices, so the run costs seconds of generation.
"""

from __future__ import annotations

import schemathesis

MAX_TOKENS = 4


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if _is_int(body.get(key)) and body[key] > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS
    if _is_int(body.get("n")) and body["n"] > 2:
        body["n"] = 2
