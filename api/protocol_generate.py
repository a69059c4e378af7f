"""SGLang's native request body (``POST /generate``), and what each of its items asks of Corral.

The body is SGLang's ``GenerateReqInput``: ``text`` or ``input_ids`` (one prompt, or a list of
them: a batch), ``sampling_params`` (one object for every item, or one per item), the logprob
fields (each a value for every item or a list of them) and ``stream``. As in Corral's OpenAI
endpoints, no field is silently ignored: an unknown field or a value Corral cannot honour is a
400 naming it, and types are strict.

Every item becomes the ``CompletionRequest`` it means (``GenerateItem.completion``), so the
constraint fields (``regex``, ``json_schema``, ``ebnf``, ``structural_tag``), the limits and the
sampling checks are the completions endpoint's own; their errors are renamed to the field the
client sent (``sampling_params.json_schema``) by ``renamed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError, model_validator

from corral.api.errors import ApiError, bad_request
from corral.api.messages import _Closed
from corral.api.protocol import MAX_STOP_TOKEN_IDS, MAX_TOKENS_BOUND, CompletionRequest
from corral.api.response_formats import request_error

#: The most prompts one /generate batch may carry (select sends one per choice).
MAX_BATCH = 64

#: SGLang's sampling field -> the CompletionRequest field with the same meaning.
RENAMED = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}
#: ... and back, for error messages.
ORIGINAL = {v: k for k, v in RENAMED.items()} | {"response_format": "structural_tag"}


class _NullsAbsent(_Closed):
    """SGLang's clients send unset fields as ``null``: a null field is read as absent."""

    @model_validator(mode="wrap")
    @classmethod
    def _absent(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None}
        return handler(data)


class GenerateSampling(_NullsAbsent):
    """SGLang's ``sampling_params``; ``null`` means absent (SGLang's default)."""

    max_new_tokens: int = Field(default=128, ge=0, le=MAX_TOKENS_BOUND)
    min_new_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_BOUND)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=-1, ge=-1, lt=2**31, description="-1 or 0: off")
    min_p: float = Field(default=0.0, ge=0, le=1)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: float = Field(default=1.0, gt=0, le=2)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = Field(
        default=True, description="only true (what a fast tokenizer does) is served"
    )
    no_stop_trim: bool = Field(default=False, description="only false: stops are trimmed")
    sampling_seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    stop_regex: str | list[str] | None = Field(default=None, description="not supported")
    speculative: bool = Field(
        default=True, description="Corral extension: false turns prompt-lookup speculation off"
    )

    @model_validator(mode="after")
    def _check(self) -> GenerateSampling:
        if not self.spaces_between_special_tokens:
            raise request_error(("spaces_between_special_tokens",), "only true is supported")
        if self.no_stop_trim:
            raise request_error(("no_stop_trim",), "only false: stop strings are trimmed")
        if self.stop_regex:
            raise request_error(("stop_regex",), "stop regexes are not supported; send stop")
        return self


class GenerateRequest(_NullsAbsent):
    """SGLang's ``GenerateReqInput`` (the fields Corral serves)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: GenerateSampling | list[GenerateSampling] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1
    top_logprobs_num: int | list[int] = 0
    return_text_in_logprobs: bool = False
    stream: bool = False

    @model_validator(mode="after")
    def _check(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise request_error(("text",), "send exactly one of text and input_ids")
        return self

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompts, one per item (a single prompt is a batch of one)."""
        field = "text" if self.text is not None else "input_ids"
        value = self.text if self.text is not None else self.input_ids
        items = value if self.is_batch else [value]
        if not items:
            raise bad_request(f"{field}: the batch is empty; send at least one prompt", field)
        if len(items) > MAX_BATCH:
            raise bad_request(f"{field}: at most {MAX_BATCH} prompts per request", field)
        return items  # type: ignore[return-value]

    def items(self) -> list[GenerateItem]:
        prompts = self.prompts()
        n = len(prompts)
        sampling = _per_item(self.sampling_params, n, "sampling_params")
        logprob = _per_item(self.return_logprob, n, "return_logprob")
        start = _per_item(self.logprob_start_len, n, "logprob_start_len")
        top = _per_item(self.top_logprobs_num, n, "top_logprobs_num")
        rids = _per_item(self.rid, n, "rid")
        for i, k in enumerate(top):
            if not 0 <= k <= 20:
                raise bad_request(
                    f"top_logprobs_num must be in [0, 20], got {k}", _at("top_logprobs_num", i, n)
                )
        for i, s in enumerate(start):
            if s < -1:
                raise bad_request(
                    f"logprob_start_len must be >= -1, got {s}", _at("logprob_start_len", i, n)
                )
        return [
            GenerateItem(
                index=i,
                prompt=prompts[i],
                sampling=sampling[i] or GenerateSampling(),
                return_logprob=logprob[i],
                logprob_start_len=start[i],
                top_logprobs_num=top[i],
                rid=rids[i],
                param=_at("text" if self.text is not None else "input_ids", i, n),
            )
            for i in range(n)
        ]


@dataclass(frozen=True)
class GenerateItem:
    """One prompt of a /generate request and what it asks for."""

    index: int
    prompt: str | list[int]
    sampling: GenerateSampling
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    rid: str | None
    param: str  # "text", "text[3]", "input_ids[0]": where the prompt is in the body

    def completion(self, model: str, prompt_ids: list[int]) -> CompletionRequest:
        """The completions request this item means (its constraint, limits and sampling)."""
        s = self.sampling
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": max(1, s.max_new_tokens),  # 0 (prefill only) is applied later
            "min_tokens": s.min_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "frequency_penalty": s.frequency_penalty,
            "presence_penalty": s.presence_penalty,
            "repetition_penalty": s.repetition_penalty,
            "stop": s.stop,
            "stop_token_ids": s.stop_token_ids,
            "ignore_eos": s.ignore_eos,
            "speculative": s.speculative,
            "n": s.n,
            "skip_special_tokens": s.skip_special_tokens,
            "seed": s.sampling_seed,
            "regex": s.regex,
            "json_schema": s.json_schema,
            "ebnf": s.ebnf,
            "response_format": _structural_tag(s.structural_tag),
        }
        try:
            return CompletionRequest.model_validate(body)
        except ValidationError as e:
            raise _sampling_error(e) from None


def _structural_tag(tag: str | None) -> dict[str, Any] | None:
    """SGLang sends a structural tag as JSON text: the format Corral's response_format takes."""
    if tag is None:
        return None
    try:
        value = json.loads(tag)
    except (ValueError, RecursionError):
        raise bad_request("sampling_params.structural_tag: not valid JSON text",
                          "sampling_params.structural_tag") from None  # fmt: skip
    if not isinstance(value, dict):
        raise bad_request("sampling_params.structural_tag: a JSON object is expected",
                          "sampling_params.structural_tag")  # fmt: skip
    return {"type": "structural_tag", **value}


def _sampling_error(e: ValidationError) -> ApiError:
    first = e.errors()[0]
    loc = [ORIGINAL.get(str(p), str(p)) if i == 0 else str(p) for i, p in enumerate(first["loc"])]
    if loc and loc[0] == "structural_tag" and len(loc) > 1 and loc[1] == "structural_tag":
        loc = loc[1:]  # the union tag pydantic puts in the path
    param = "sampling_params" + "".join(f".{p}" if not p.isdigit() else f"[{p}]" for p in loc)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return bad_request(f"{param}: {msg}", param, "invalid_value")


def renamed(e: ApiError) -> ApiError:
    """An error the completions path raised, naming the field as SGLang's body spells it."""
    param = e.param or ""
    head = param.split(".")[0].split("[")[0]
    if head not in ORIGINAL and head not in GenerateSampling.model_fields:
        return e
    new = "sampling_params." + ORIGINAL.get(head, head) + param[len(head) :]
    message = e.message.replace(f"{param}:", f"{new}:", 1) if param else e.message
    out = ApiError(e.status, message, type=e.type, param=new, code=e.code, headers=e.headers,
                   extra=e.extra)  # fmt: skip
    return out


def _per_item(value: Any, n: int, field: str) -> list[Any]:
    if not isinstance(value, list):
        return [value] * n
    if len(value) != n:
        raise bad_request(f"{field}: {len(value)} values for {n} prompts; send one per prompt "
                          "or a single one", field)  # fmt: skip
    return value


def _at(field: str, i: int, n: int) -> str:
    return f"{field}[{i}]" if n > 1 else field
