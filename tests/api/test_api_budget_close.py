"""`budget_close` against a real `corral serve`: a json_schema answer that max_tokens would cut
is closed as a valid instance (jsonschema judges), finish_reason stays "length" and the choice
names what was cut short; `"budget_close": false` keeps the peers' truncation. A `oneOf` whose
branches differ only in `required` closes inside the branch the answer entered."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from budget_schemas import AREA

from corral.api.tool_formats import GENERIC
from corral.api.tools import TOOL_JSON_FORMAT
from corral.grammar import ConstraintSpec
from corral.grammar.closing.shortest import JsonCloser

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "age": {"type": "integer", "minimum": 0},
    },
    "required": ["name", "tags", "age"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
PROMPT = "Describe a person with a very long name and twenty tags, as JSON."


def post(server, body: dict, path: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    return httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=120)


def ask(server, path: str, stream: bool = False, **extra) -> httpx.Response:
    body = {"model": server.model, "max_tokens": 24, "temperature": 0, "response_format": FORMAT}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT + "\n"
    return post(server, body | {"stream": stream} | extra, path)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_cut_answer_is_closed_and_reported(server, path):
    r = ask(server, path)
    assert r.status_code == 200, r.text[:800]
    choice = r.json()["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    jsonschema.validate(json.loads(text), SCHEMA)
    report = choice.get("budget_close")  # absent where budget closing played no part
    if path.endswith("chat/completions"):  # this answer is known to run past 24 tokens
        assert choice["finish_reason"] == "length"
    if choice["finish_reason"] == "length":
        assert report["steered"] and report["complete"] and report["cut_short"]
    else:
        assert report is None


def test_streamed_report_comes_with_the_last_chunk(server):
    r = ask(server, "/v1/chat/completions", stream=True)
    assert r.status_code == 200, r.text[:800]
    chunks = [
        json.loads(line[6:])
        for line in r.text.splitlines()
        if line.startswith("data: {") and '"choices":[{' in line
    ]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    jsonschema.validate(json.loads(text), SCHEMA)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["budget_close"]["steered"]


def test_opting_out_keeps_the_cut(server):
    r = ask(server, "/v1/chat/completions", budget_close=False)
    assert r.status_code == 200, r.text[:800]
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice.get("budget_close") is None
    with pytest.raises(ValueError):
        json.loads(choice["message"]["content"])


def test_budget_close_must_be_a_boolean(server):
    r = ask(server, "/v1/chat/completions", budget_close="yes")
    assert r.status_code == 400, r.text[:800]


@pytest.mark.parametrize("extra", [0, 8, 32])
def test_a_one_of_by_required_closes_in_its_branch(server, smol_tokenizer, extra):
    """Glaiveai2K's calculate_area shape through the openai client: `oneOf` branches that
    differ only in `required`; whatever branch the answer enters, the closed instance is in
    exactly one (jsonschema judges against the schema sent), and it is reported complete."""
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(AREA))
    need = len(smol_tokenizer.encode(closer.shortest(closer.root), add_special_tokens=False))
    r = server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "The area of a triangle, base 12.5 and height 7?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "area", "schema": AREA}},
        max_tokens=need + extra,
        temperature=0,
    )
    choice = r.choices[0]
    jsonschema.validate(json.loads(choice.message.content), AREA)
    report = choice.model_extra.get("budget_close")
    if choice.finish_reason == "length":
        assert report["complete"], report


AREA_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate_area",
        "description": "The area of a circle, a rectangle or a triangle",
        "parameters": AREA,
    },
}


@pytest.mark.parametrize("extra", [0, 8, 32])
def test_a_cut_tool_call_is_closed(server, smol_tokenizer, extra):
    """Budget closing is on by default for tool calls: with max_tokens from the shortest call
    (the server's generic format) up, the call comes back complete, its arguments valid."""
    args = JsonCloser.for_spec(ConstraintSpec.json_schema(AREA, json_format=TOOL_JSON_FORMAT))
    call = GENERIC.begins("calculate_area")[0] + args.shortest(args.root) + GENERIC.end
    need = len(smol_tokenizer.encode(call, add_special_tokens=False))
    r = server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "The area of a triangle, base 12.5 and height 7?"}],
        tools=[AREA_TOOL],
        tool_choice="required",
        max_tokens=need + extra,
        temperature=0,
    )
    choice = r.choices[0]
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), AREA)
    report = choice.model_extra.get("budget_close")
    if extra == 0:  # the model writes more than the shortest call
        assert choice.finish_reason == "length" and report["steered"], report
    if choice.finish_reason == "length":
        assert report["complete"], report
