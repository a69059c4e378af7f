"""/v1/responses against a real `corral serve`, through the real `openai` client.

Every Response and every stream event is validated against the `openai` package's own pydantic
types (not just read loosely), structured outputs and tool arguments are judged by `jsonschema`,
and the translation is checked against the chat endpoint: the same conversation, greedy, gives
the same text on both.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from corral.api.protocol_responses import ResponsesRequest
from corral.api.responses_output import ResponseDraft, Translator, message_delta

EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
            "unit": {"enum": ["c", "f"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
ASK = "What is the weather in Oslo? Use the tool."
# uniqueItems over a large bounded item domain cannot be enforced exactly: strict refuses it
UNIQUE_STRINGS = {
    "type": "array",
    "items": {"type": "string", "maxLength": 8},
    "maxItems": 3,
    "uniqueItems": True,
}


class Verdict(BaseModel):
    sunny: bool
    score: int = Field(ge=0, le=9)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _post(server, body: dict, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.post(f"{server.url}/v1/responses", json=body, headers=headers, timeout=120, **kw)


def _events(server, body: dict) -> list[dict]:
    """The stream's events as sent, each checked against openai's event types."""
    r = _post(server, body | {"stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in r.text.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENT.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def _parse(sse: list[str]) -> list[dict]:
    return [json.loads(e.split("\ndata: ", 1)[1]) for e in sse]


def test_translator_streams_reasoning_text_and_calls_in_order():
    """Chat deltas of every kind the chat path sends (a reasoning model's think block, text,
    tool-call argument pieces) become events openai's types accept, in OpenAI's order, and the
    streamed Response equals the one built from the finished message."""
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", "tools": [WEATHER]})
    t = Translator(ResponseDraft(req, "m"))
    deltas = [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "The user "}, {"reasoning_content": "wants Oslo."},
        {"content": "Calling."},
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo", '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"unit": "c"}'}}]},
    ]  # fmt: skip
    sse = [e for d in deltas for e in t.delta(d, None)] + t.delta({}, "tool_calls") + t.end()
    events = _parse(sse)
    for e in events:
        EVENT.validate_python(e)
    kinds = [e["type"].removeprefix("response.") for e in events]
    assert kinds == [
        "created", "in_progress",
        "output_item.added", "content_part.added", "reasoning_text.delta", "reasoning_text.delta",
        "reasoning_text.done", "content_part.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.delta",
        "output_text.done", "content_part.done", "output_item.done",
        "output_item.added", "function_call_arguments.delta", "function_call_arguments.delta",
        "function_call_arguments.done", "output_item.done",
        "completed",
    ]  # fmt: skip
    streamed = Response.model_validate(events[-1]["response"])
    assert [o.type for o in streamed.output] == ["reasoning", "message", "function_call"]
    assert streamed.output[0].content[0].text == "The user wants Oslo."
    assert streamed.output_text == "Calling."
    assert streamed.output[2].arguments == '{"city": "Oslo", "unit": "c"}'

    whole = Translator(ResponseDraft(req, "m"))
    message = {
        "reasoning_content": "The user wants Oslo.",
        "content": "Calling.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}],
    }  # fmt: skip
    whole.delta(message_delta(message), "tool_calls")
    built = Response.model_validate(whole.draft.body())

    def shape(r: Response) -> list[dict]:
        return [o.model_dump(exclude={"id"}) for o in r.output]

    assert shape(built) == shape(streamed)


def test_translator_reports_a_failure_as_failed():
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
    t = Translator(ResponseDraft(req, "m"))
    events = _parse(
        t.delta({"content": "partial"}, None)
        + t.fail({"message": "the output could not be continued", "code": "constraint_failed"})
    )
    for e in events:
        EVENT.validate_python(e)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert events[-2]["code"] == "constraint_failed"
    assert not any(e["type"] == "response.completed" for e in events)


def test_text_matches_the_chat_endpoint(server, client):
    conversation = [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ]
    chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "system", "content": "Be brief."}, *conversation],
        temperature=0,
        max_tokens=8,
    )
    r = _post(
        server,
        {
            "model": server.model,
            "instructions": "Be brief.",
            "input": conversation,
            "temperature": 0,
            "max_output_tokens": 8,
        },
    )
    assert r.status_code == 200, r.text
    resp = Response.model_validate(r.json())
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    truncated = chat.choices[0].finish_reason == "length"
    assert resp.status == ("incomplete" if truncated else "completed")
    assert resp.store is False and resp.instructions == "Be brief."


def test_max_output_tokens_makes_it_incomplete(server, client):
    resp = client.responses.create(
        model=server.model, input="Tell me a long story.", max_output_tokens=2, temperature=0
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 2 and resp.output_text
    events = _events(
        server, {"model": server.model, "input": "Tell me a long story.", "max_output_tokens": 2}
    )
    assert events[-1]["type"] == "response.incomplete"


def test_parse_json_schema(server, client):
    parsed = client.responses.parse(
        model=server.model,
        input="Is it sunny in Lima? Answer as JSON.",
        text_format=Verdict,
        max_output_tokens=40,
        temperature=0,
    )
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, Verdict)
    jsonschema.validate(json.loads(parsed.output_text), Verdict.model_json_schema())


def test_lenient_report_names_the_responses_field(server):
    fmt = {"type": "json_schema", "name": "n", "schema": UNIQUE_STRINGS, "strict": False}
    body = {"model": server.model, "input": "List words.", "text": {"format": fmt},
            "max_output_tokens": 12}  # fmt: skip
    r = _post(server, body)
    assert r.status_code == 200, r.text
    report = r.json()["unenforced"]
    assert [(u["param"], u["keyword"]) for u in report] == [("text.format.schema", "uniqueItems")]


def test_streamed_text_events(server):
    body = {"model": server.model, "input": "Say hello.", "max_output_tokens": 6}
    events = _events(server, body)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    final = Response.model_validate(events[-1]["response"])
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == final.output_text and deltas
    assert final.usage.output_tokens > 0


def test_required_tool_call(server, client):
    resp = client.responses.create(
        model=server.model, input=ASK, tools=[WEATHER], tool_choice="required", temperature=0
    )
    assert resp.status == "completed"
    calls = [o for o in resp.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" and c.call_id for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), WEATHER["parameters"])


def test_streamed_tool_call(server, client):
    with client.responses.stream(
        model=server.model,
        input=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (call,) = [o for o in final.output if o.type == "function_call"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == call.arguments


def test_function_call_round_trip(server, client):
    """A client's function_call and function_call_output items reach the model as the chat
    endpoint's assistant tool calls and tool message do: greedy, both say the same."""
    args = '{"city": "Oslo", "unit": "c"}'
    chat = client.chat.completions.create(
        model=server.model,
        messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "tool_calls": [{"id": "call_7", "type": "function",
             "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_7", "content": "-3 C, snow"},
        ],
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        tool_choice="none",
        max_tokens=6,
        temperature=0,
    )  # fmt: skip
    resp = client.responses.create(
        model=server.model,
        input=[
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": "call_7", "name": "get_weather",
             "arguments": args, "id": "fc_1", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_7", "output": "-3 C, snow"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=6,
        temperature=0,
    )  # fmt: skip
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens


def _unsupported_cases() -> list[tuple[dict, str]]:
    schema = {"type": "object", "properties": {"a": UNIQUE_STRINGS}}
    tool = {"type": "function", "name": "f", "parameters": schema}
    return [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"store": True}, "store"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0].type"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}},
         "text.format.schema"),
        ({"tools": [tool], "tool_choice": "required"}, "tools[0].parameters"),
        ({"tools": [tool], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"seed": 1}, "seed"),
    ]  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), _unsupported_cases())
def test_bad_requests_are_400s_naming_the_param(server, extra, param):
    for stream in (False, True):  # refused before the first byte, streamed or not
        r = _post(server, {"model": server.model, "input": "hi", "stream": stream} | extra)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"}
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert param in error["message"]


def test_openai_client_raises_for_stored_state(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server.model, input="hi", previous_response_id="resp_1")
    assert e.value.param == "previous_response_id"
