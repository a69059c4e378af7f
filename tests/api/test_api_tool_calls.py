"""Tool calls end to end: a real `corral serve` (default model, its generic format) and the
`openai` client, which assembles the streamed calls. Every emitted call is judged by
`jsonschema`; streamed and non-streamed answers to the same seeded request must be identical.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


def _kw(server, **extra) -> dict:
    return (
        dict(
            model=server.model,
            messages=[{"role": "user", "content": "What is the weather in Oslo for 3 days?"}],
            tools=[WEATHER, TIME],
            max_tokens=60,
            temperature=0.8,
            seed=1234,
        )
        | extra
    )


def _both(server, **extra):
    """The same seeded request, non-streamed and streamed (assembled by the openai client's
    stream state); and the raw chunks."""
    client = server.client()
    kw = _kw(server, **extra)
    plain = client.chat.completions.create(**kw)
    state, chunks = ChatCompletionStreamState(), []
    for chunk in client.chat.completions.create(**kw, stream=True):
        chunks.append(chunk)
        state.handle_chunk(chunk)
    # the snapshot, not get_final_completion(), which refuses a "length" finish
    return plain.choices[0], state.current_completion_snapshot.choices[0], chunks


def _summary(choice):
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
    return choice.finish_reason, choice.message.content, calls


def _valid(choice) -> None:
    for call in choice.message.tool_calls or ():
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize(
    "extra",
    [{"tool_choice": "required"}, {"tool_choice": "auto"},
     {"tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "parallel_tool_calls": False}],
)  # fmt: skip
def test_streamed_and_plain_answers_agree_and_every_call_validates(server, extra) -> None:
    plain, streamed, chunks = _both(server, **extra)
    assert _summary(plain) == _summary(streamed)
    _valid(plain)
    if extra["tool_choice"] != "auto":
        assert plain.finish_reason == "tool_calls" and plain.message.content is None
    if extra.get("parallel_tool_calls") is False or isinstance(extra["tool_choice"], dict):
        assert len(plain.message.tool_calls) == 1
    if plain.message.tool_calls:
        assert plain.finish_reason == "tool_calls"
        first = plain.message.tool_calls[0]
        deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
        starts = [d for d in deltas if d.index == 0 and d.id]
        assert len(starts) == 1 and starts[0].function.name == first.function.name
        args = [d for d in deltas if d.index == 0 and d.function and d.function.arguments]
        if len(json.loads(first.function.arguments)) > 1:
            assert len(args) > 1, "arguments arrive as they are generated, in several deltas"


def test_a_call_cut_by_max_tokens_ends_with_length(server) -> None:
    # the generic opener of get_weather is 18 of SmolLM2's tokens, a whole call about 38; the
    # peers' cut (budget closing, on by default, would close the call: test_api_budget_close)
    plain, streamed, _ = _both(
        server, tool_choice="required", max_tokens=26, extra_body={"budget_close": False}
    )
    for choice in (plain, streamed):
        assert choice.finish_reason == "length"
        (call,) = choice.message.tool_calls  # as far as it got
        with pytest.raises(json.JSONDecodeError):
            json.loads(call.function.arguments)
    assert _summary(plain) == _summary(streamed)


def test_structural_tag_response_format(server) -> None:
    schema = WEATHER["function"]["parameters"]
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<weather>", "schema": schema, "end": "</weather>"}],
        "triggers": ["<weather>"],
        "free_text": False,  # the segment only (a 135M model rarely writes a trigger itself)
        "stop_after_first": True,
    }
    r = server.client().chat.completions.create(
        **_kw(server, tools=None, response_format=tag, max_tokens=80)
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    assert text.startswith("<weather>") and text.endswith("</weather>")
    body = text.removeprefix("<weather>")
    jsonschema.validate(json.loads(body.removesuffix("</weather>")), schema)


def test_structural_tag_schema_errors_are_a_400(server) -> None:
    import openai

    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<w>", "schema": {"type": "array", "uniqueItems": True}}],
        "triggers": ["<w>"],
    }
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(**_kw(server, tools=None, response_format=tag))
    assert info.value.param == "response_format"
    assert "/structures/0/schema/uniqueItems" in info.value.message
