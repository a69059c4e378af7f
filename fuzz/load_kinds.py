"""The soak's request mix: every endpoint and constraint kind, each with the judge of its answer.

A `Kind` builds the body of its `k`-th request and judges the `Reply` it got (`fuzz/load_replies.py`
reads replies from every endpoint, streamed or not). Judges never trust the server: JSON is
checked with `jsonschema` (Draft 2020-12), text with Python's `re`, tool calls against their
function's parameters. An output that ended with "stop" (or as complete tool calls) must be valid;
one cut by `max_tokens` is judged only where it parses (budget closing may have closed it; a
parsed but invalid output is invalid). Strings outside ASCII (CJK, accents, combining marks,
right-to-left, astral emoji) appear in prompts, property names, enum members, patterns and tool
arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import jsonschema

from corral.fuzz.load import SCHEMAS

PLACES = ("東京", "Ñuñoa", "😀 city", "Zürich", "القاهرة", "e\u0301te", "Oslo")
UNICODE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["都市", "nota", "ciudad"],
    "properties": {"都市": {"enum": ["東京", "Ñuñoa", "😀 city", "القاهرة"]},
                   "nota": {"type": "string", "maxLength": 10},
                   "ciudad": {"type": "string", "pattern": "^[a-zà-ÿ ]{1,8}$"}},
}  # fmt: skip
WEATHER = {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["city", "unit", "days"],
                   "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                                  "unit": {"enum": ["celsius", "fahrenheit"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}},
}  # fmt: skip
TIME = {
    "name": "get_time", "description": "The time in a timezone",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["tz"],
                   "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}},
}  # fmt: skip
TOOL_SCHEMAS = {t["name"]: t["parameters"] for t in (WEATHER, TIME)}
REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])"
CHOICES = ("positive", "negative", "neutral", "ñandú")
EBNF = 'root ::= answer ", " word\nanswer ::= "yes" | "no" | "sí"\nword ::= [a-z] [a-z]? [a-z]?'
EBNF_JUDGE = "(yes|no|sí), [a-z]{1,3}"
LARK = 'start: "ID-" NUM ("-" NUM)?\nNUM: /[0-9]{2,4}/'
LARK_JUDGE = "ID-[0-9]{2,4}(-[0-9]{2,4})?"
TAG = {"type": "structural_tag", "triggers": ["<weather>"], "free_text": False,
       "stop_after_first": True,
       "structures": [{"begin": "<weather>", "schema": WEATHER["parameters"], "end": "</weather>"}]}  # fmt: skip
VARIANTS = (
    48  # distinct schemas the constraint endpoints rotate through (the cache fills, then holds)
)


@dataclass
class Reply:
    """One answer, whatever the endpoint: `finish` is "stop", "length" or "tool_calls"."""

    status: int
    text: str = ""
    calls: list[tuple[str, str]] | None = None  # (function name, arguments JSON text)
    finish: str | None = None
    error: str | None = None  # an error event in a stream, or a 4xx/5xx body
    body: dict | None = None  # the JSON body of a non-generating endpoint


Judge = Callable[[dict, Reply], "str | None"]  # None: valid; otherwise what was wrong


@dataclass(frozen=True)
class Kind:
    name: str
    path: str
    build: Callable[[str, int], dict]  # (model, k) -> the request body, without "stream"
    judge: Judge
    streams: bool = True
    status: int = 200  # the status a correct server answers with


def _json(schema: dict, text: str, finish: str | None) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None if finish == "length" else f"not JSON: {text!r}"
    try:
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as e:
        return f"invalid {text!r}: {e.message}"
    return None


def _text_kind(judge: Callable[[str], bool]) -> Judge:
    def check(req: dict, r: Reply) -> str | None:
        if r.finish == "stop" and not judge(r.text):
            return f"invalid {r.text!r}"
        return None if r.finish in ("stop", "length") else f"finish {r.finish!r}"

    return check


def _schema_kind(schema_of: Callable[[dict], dict]) -> Judge:
    def check(req: dict, r: Reply) -> str | None:
        if r.finish not in ("stop", "length"):
            return f"finish {r.finish!r}"
        return _json(schema_of(req), r.text, r.finish)

    return check


def _tools_judge(allowed: tuple[str, ...], must_call: bool) -> Judge:
    def check(req: dict, r: Reply) -> str | None:
        calls = r.calls or []
        if must_call and r.finish == "stop":
            return f"no tool call under a forced tool_choice: {r.text!r}"
        if r.finish not in ("stop", "length", "tool_calls"):
            return f"finish {r.finish!r}"
        for name, args in calls:
            if name not in allowed:
                return f"call to {name!r}"
            cut = "length" if r.finish == "length" else "stop"
            if bad := _json(TOOL_SCHEMAS[name], args, cut):
                return f"{name}: {bad}"
        return None

    return check


def _chat(prompt: str, max_tokens: int, **kw) -> Callable[[str, int], dict]:
    def build(model: str, k: int) -> dict:
        text = prompt.format(place=PLACES[k % len(PLACES)])
        return {"model": model, "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens, "seed": k, "temperature": 0.8} | kw  # fmt: skip

    return build


def _schema_variant(k: int) -> dict:
    v = k % VARIANTS
    return {"type": "object", "additionalProperties": False, "required": [f"p{v}"],
            "properties": {f"p{v}": {"type": "integer", "minimum": 0, "maximum": v + 1}}}  # fmt: skip


def _fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}


def _rotating_schema(model: str, k: int) -> dict:
    req = _chat("Describe {place} as JSON.", 48)(model, k)
    return req | {"response_format": _fmt(SCHEMAS[k % len(SCHEMAS)])}


def _tools(choice: object) -> dict:
    tools = [{"type": "function", "function": t | {"strict": True}} for t in (WEATHER, TIME)]
    return {"tools": tools, "tool_choice": choice}


def _responses_build(tools: bool) -> Callable[[str, int], dict]:
    def build(model: str, k: int) -> dict:
        place = PLACES[k % len(PLACES)]
        if tools:
            fns = [{"type": "function", "strict": True} | t for t in (WEATHER, TIME)]
            return {"model": model, "input": f"What is the weather in {place} for 2 days?",
                    "max_output_tokens": 60, "tools": fns, "tool_choice": "required"}  # fmt: skip
        fmt = {"type": "json_schema", "name": "u", "schema": UNICODE_SCHEMA, "strict": True}
        return {"model": model, "input": f"Describe {place} as JSON.", "max_output_tokens": 60,
                "text": {"format": fmt}}  # fmt: skip

    return build


def _receipt(req: dict, r: Reply) -> str | None:
    receipt = (r.body or {}).get("corral") or {}
    return None if receipt.get("exact") is True else f"no exact receipt: {r.body!r}"


def _refusal(req: dict, r: Reply) -> str | None:
    return None if r.error and "nope" in r.error else f"400 without the pointer: {r.error!r}"


CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
KINDS: tuple[Kind, ...] = (
    Kind(
        "chat.json_schema",
        CHAT,
        _rotating_schema,
        _schema_kind(lambda q: q["response_format"]["json_schema"]["schema"]),
    ),
    Kind(
        "chat.json_schema.unicode",
        CHAT,
        _chat("Describe {place} as JSON, in Spanish.", 60, response_format=_fmt(UNICODE_SCHEMA)),
        _schema_kind(lambda q: UNICODE_SCHEMA),
    ),
    Kind(
        "chat.json_object",
        CHAT,
        _chat("Describe {place} as a JSON object.", 48, response_format={"type": "json_object"}),
        _schema_kind(lambda q: {"type": "object"}),
    ),
    Kind(
        "chat.regex",
        CHAT,
        _chat("When did you visit {place}?", 16, response_format={"type": "regex", "regex": REGEX}),
        _text_kind(lambda t: re.fullmatch(REGEX, t) is not None),
    ),
    Kind(
        "chat.choice",
        CHAT,
        _chat(
            "How do you feel about {place}?",
            8,
            response_format={"type": "choice", "choice": list(CHOICES)},
        ),
        _text_kind(lambda t: t in CHOICES),
    ),
    Kind(
        "chat.ebnf",
        CHAT,
        _chat("Is {place} big?", 16, response_format={"type": "grammar", "grammar": EBNF}),
        _text_kind(lambda t: re.fullmatch(EBNF_JUDGE, t) is not None),
    ),
    Kind(
        "chat.lark",
        CHAT,
        _chat(
            "Give an id for {place}.",
            16,
            response_format={"type": "grammar", "syntax": "lark", "grammar": LARK},
        ),
        _text_kind(lambda t: re.fullmatch(LARK_JUDGE, t) is not None),
    ),
    Kind(
        "chat.structural_tag",
        CHAT,
        _chat("The weather in {place}?", 70, response_format=TAG),
        _text_kind(
            lambda t: (
                t.startswith("<weather>")
                and t.endswith("</weather>")
                and _json(WEATHER["parameters"], t[9:-10], "stop") is None
            )
        ),
    ),  # fmt: skip
    Kind(
        "chat.tools.required",
        CHAT,
        _chat("What is the weather in {place} for 3 days?", 60, **_tools("required")),
        _tools_judge(("get_weather", "get_time"), must_call=True),
    ),
    Kind(
        "chat.tools.named",
        CHAT,
        _chat(
            "Weather in {place}, please.",
            60,
            **_tools({"type": "function", "function": {"name": "get_weather"}}),
        ),
        _tools_judge(("get_weather",), must_call=True),
    ),
    Kind(
        "chat.tools.auto",
        CHAT,
        _chat("What time is it in {place}?", 40, **_tools("auto")),
        _tools_judge(("get_weather", "get_time"), must_call=False),
    ),
    Kind(
        "completions.regex",
        COMPLETIONS,
        lambda m, k: {
            "model": m,
            "prompt": f"Year of the trip to {PLACES[k % len(PLACES)]}:",
            "max_tokens": 16,
            "seed": k,
            "response_format": {"type": "regex", "regex": REGEX},
        },
        _text_kind(lambda t: re.fullmatch(REGEX, t) is not None),
    ),  # fmt: skip
    Kind(
        "completions.plain",
        COMPLETIONS,
        lambda m, k: {
            "model": m,
            "prompt": f"A story about {PLACES[k % len(PLACES)]}:",
            "max_tokens": 24,
            "seed": k,
        },
        _text_kind(lambda t: True),
    ),  # fmt: skip
    Kind(
        "responses.json_schema",
        RESPONSES,
        _responses_build(tools=False),
        _schema_kind(lambda q: UNICODE_SCHEMA),
    ),
    Kind(
        "responses.tools",
        RESPONSES,
        _responses_build(tools=True),
        _tools_judge(("get_weather", "get_time"), must_call=True),
    ),
    Kind(
        "constraints.validate",
        "/v1/constraints/validate",
        lambda m, k: {"response_format": _fmt(_schema_variant(k))},
        _receipt,
        streams=False,
    ),
    Kind(
        "constraints.precompile",
        "/v1/constraints",
        lambda m, k: (
            _tools("required") if k % 2 else {"response_format": _fmt(_schema_variant(k + 1))}
        ),
        _receipt,
        streams=False,
    ),  # fmt: skip
    Kind(
        "constraints.refused",
        "/v1/constraints/validate",
        lambda m, k: {"response_format": _fmt({"$ref": "#/$defs/nope"})},
        _refusal,
        streams=False,
        status=400,
    ),  # fmt: skip
)
