"""End to end: a real `corral serve` (default model) driven by the official `openai` client.

Every constrained output is judged by `jsonschema` / `re.fullmatch`, never by eye. Outputs are
kept short (small max_tokens, bounded schemas) so the whole file runs in a couple of minutes.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from pydantic import BaseModel, Field

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
FORMAT = jsonschema.Draft202012Validator.FORMAT_CHECKER


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_lists_the_served_model(server) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == [server.model]


def test_plain_chat(server) -> None:
    r = server.client().chat.completions.create(
        model=server.model, messages=ask("Say hello."), max_tokens=8, temperature=0
    )
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_matches_the_non_streamed_answer(server) -> None:
    client = server.client()
    kw = dict(model=server.model, messages=ask("Name three colours."), max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole.choices[0].finish_reason]
    assert (
        not chunks[-1].choices
        and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )


def test_json_schema_strict_validates(server) -> None:
    r = server.client().chat.completions.create(
        model=server.model,
        messages=ask("Describe a person as JSON."),
        max_tokens=80,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON, format_checker=FORMAT)


def test_json_object_is_an_object(server) -> None:
    r = server.client().chat.completions.create(
        model=server.model,
        messages=ask('Reply with the JSON object {"ok": true} and nothing else.'),
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize(
    ("fmt", "check"),
    [({"type": "regex", "regex": r"[0-9]{3}-[0-9]{4}"}, lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
     ({"type": "grammar", "grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
     ({"type": "grammar", "syntax": "lark", "grammar": 'start: COLOR\nCOLOR: "red" | "green"'}, lambda t: t in ("red", "green")),
     ({"type": "choice", "choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma"))],
)  # fmt: skip
def test_extensions_constrain_the_output(server, fmt, check) -> None:
    r = server.client().chat.completions.create(
        model=server.model, messages=ask("Answer."), max_tokens=12, response_format=fmt
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and check(text), text


OPEN_PERSON = {  # says nothing about extra keys: JSON Schema allows any
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name"],
}


def _open_person(server, text: str, max_tokens: int, **extra):
    return server.client().chat.completions.create(
        model=server.model,
        messages=ask(text),
        max_tokens=max_tokens,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": OPEN_PERSON, "strict": True},
        },
        **extra,
    )


def test_objects_get_only_their_declared_properties_by_default(server) -> None:
    r = _open_person(server, "Describe a person as JSON with name, age, city, job and hobbies.", 60)
    assert r.choices[0].finish_reason == "stop"
    out = json.loads(r.choices[0].message.content)
    jsonschema.validate(out, OPEN_PERSON, format_checker=FORMAT)
    assert set(out) <= {"name", "age"}, out


def test_open_objects_extension_is_accepted_and_output_stays_valid(server) -> None:
    r = _open_person(server, "Describe a person as JSON.", 40, extra_body={"open_objects": True})
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), OPEN_PERSON)


def _assert_valid_calls(message, names: set[str]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    assert message.tool_calls and message.content is None
    for call in message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_tool_choice_required(server) -> None:
    r = server.client().chat.completions.create(
        model=server.model,
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    _assert_valid_calls(r.choices[0].message, {"get_weather", "get_time"})
    assert len(r.choices[0].message.tool_calls) == 1


def test_tool_choice_named_and_streamed(server) -> None:
    kw = dict(
        model=server.model,
        messages=ask("What time is it in Tokyo?"),
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=40,
        temperature=0,
    )
    client = server.client()
    r = client.chat.completions.create(**kw)
    _assert_valid_calls(r.choices[0].message, {"get_time"})
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].id.startswith("call_") and deltas[0].function.name == "get_time"
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args) == json.loads(r.choices[0].message.tool_calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_round_trip(server) -> None:
    client = server.client()
    messages = ask("What is the weather in Oslo?")
    first = client.chat.completions.create(
        model=server.model,
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=60,
    )
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 12})},
    ]
    second = client.chat.completions.create(
        model=server.model, messages=messages, tools=[WEATHER], max_tokens=24, temperature=0
    )
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":
        _assert_valid_calls(choice.message, {"get_weather"})
    else:
        assert choice.message.content and not choice.message.content.startswith("<tool_call>")


class Pet(BaseModel):
    kind: str = Field(max_length=8)
    legs: int = Field(ge=0, le=8)


def test_parse_helper_with_pydantic(server) -> None:
    r = server.client().chat.completions.parse(
        model=server.model, messages=ask("Describe a pet."), response_format=Pet, max_tokens=60
    )
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and 0 <= pet.legs <= 8


def test_lenient_mode_reports_unenforced_keywords(server) -> None:
    # uniqueItems over an unbounded item domain cannot be enforced exactly
    schema = {
        "type": "array",
        "items": {"type": "string", "maxLength": 3},
        "maxItems": 3,
        "uniqueItems": True,
    }
    r = server.client().chat.completions.create(
        model=server.model,
        messages=ask("List numbers."),
        max_tokens=20,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "n", "schema": schema, "strict": False},
        },
    )
    report = r.model_extra["unenforced"]
    assert [(u["pointer"], u["keyword"]) for u in report] == [("/uniqueItems", "uniqueItems")]
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, {k: v for k, v in schema.items() if k != "uniqueItems"})


def test_n_seed_logprobs_and_stop(server) -> None:
    client = server.client()
    kw = dict(model=server.model, messages=ask("Tell a story."), max_tokens=6, seed=42, n=2,
              logprobs=True, top_logprobs=2)  # fmt: skip
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens == sum(len(c.logprobs.content) for c in a.choices)
    for c in a.choices:
        assert "".join(t.token for t in c.logprobs.content) == c.message.content
        for t in c.logprobs.content:
            assert t.logprob <= 0 and len(t.top_logprobs) == 2
            assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    whole = client.chat.completions.create(
        model=server.model, messages=ask("Count: 1, 2, 3"), max_tokens=20, temperature=0
    )
    text = whole.choices[0].message.content
    if len(text) > 4:
        cut = text[2:4]
        r = client.chat.completions.create(
            model=server.model,
            messages=ask("Count: 1, 2, 3"),
            max_tokens=20,
            temperature=0,
            stop=[cut],
        )
        assert r.choices[0].message.content == text[: text.index(cut)]
        assert r.choices[0].finish_reason == "stop"


def test_completions_endpoint(server) -> None:
    client = server.client()
    r = client.completions.create(
        model=server.model, prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 5
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=server.model, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True) if c.choices)  # fmt: skip
    assert streamed == r.choices[0].text
    regex = client.completions.create(
        model=server.model,
        prompt="Year:",
        max_tokens=8,
        extra_body={"response_format": {"type": "regex", "regex": "(19|20)[0-9]{2}"}},
    )
    assert re.fullmatch(r"(19|20)[0-9]{2}", regex.choices[0].text)
