"""Checks `Engine.add_request` makes before anything is queued: client mistakes are
`RequestError`s (HTTP 400), found here rather than as a failure inside a step."""

from __future__ import annotations

from corral.engine.serving.core import RequestError, SamplingParams


def validate_prompt(
    prompt: list[int], params: SamplingParams, vocab_size: int, max_model_len: int, capacity: int
) -> None:
    """Empty prompt, unknown token ids, prompt + max_tokens beyond the context or the KV cache."""
    if not prompt:
        raise RequestError("the prompt is empty; send at least one token")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise RequestError(f"prompt token ids must lie in [0, {vocab_size})")
    start = params.prompt_logprobs_from
    if start is not None and start >= len(prompt):
        raise RequestError(
            f"prompt logprobs start at position {start} but the prompt has {len(prompt)} "
            f"tokens; start at most at {len(prompt) - 1}"
        )
    total = len(prompt) + params.max_tokens
    if total > max_model_len:
        raise RequestError(
            f"the prompt has {len(prompt)} tokens and max_tokens is {params.max_tokens}: "
            f"{total} exceeds the context length of {max_model_len}; shorten the "
            "prompt or lower max_tokens"
        )
    if total > capacity:
        raise RequestError(
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({params.max_tokens}) "
            f"needs {total} KV slots but the whole KV cache holds {capacity}; "
            "lower max_tokens or start the engine with a larger kv_cache_bytes"
        )


def validate_budget_close(params: SamplingParams, fingerprint: str | None) -> None:
    """A budget closing built for another tokenizer (`BudgetClose.tokenizer_fingerprint`) is
    refused, where the engine knows its own tokenizer's fingerprint: its token bytes would
    spell other text."""
    close = params.budget_close
    if close is None or fingerprint is None:
        return
    theirs = getattr(close, "tokenizer_fingerprint", None)
    if theirs != fingerprint:
        raise RequestError(
            f"budget_close was built for another tokenizer (fingerprint {str(theirs)[:12]}, "
            f"this model's is {fingerprint[:12]}); build it for this model's tokenizer"
        )


def validate_constraint(constraint, vocab_size: int, fingerprint: str | None) -> None:
    """A constraint compiled for another tokenizer is refused before it reaches the step.

    With the engine's tokenizer `fingerprint` known, the constraint's `tokenizer_fingerprint`
    must equal it. Always, the constraint's mask width (`constraint_vocab_size`) must equal
    the model's vocabulary. The engine stays independent of `corral.grammar`: duck typing.
    """
    if fingerprint is not None:
        theirs = getattr(constraint, "tokenizer_fingerprint", None)
        if theirs != fingerprint:
            raise RequestError(
                f"the constraint was compiled for another tokenizer (fingerprint "
                f"{str(theirs)[:12]}, this model's is {fingerprint[:12]}); compile it for "
                "this model's tokenizer"
            )
    width = constraint_vocab_size(constraint)
    if width is not None and width != vocab_size:
        raise RequestError(
            f"the constraint's token masks cover {width} tokens but the model has {vocab_size}; "
            "compile it for this model's tokenizer"
        )


def constraint_vocab_size(constraint) -> int | None:
    """The vocabulary a compiled constraint's masks cover (its `vocab_size`), None when it
    does not say."""
    width = getattr(constraint, "vocab_size", None)
    return None if width is None else int(width)
