"""Per-token provenance in `logprobs.content[]` against a real `corral serve`: `provenance`
(sampled, forced, closed) and `allowed_tokens` on every entry, one entry per completion token,
strict JSON (no -inf or NaN anywhere), in whole and streamed responses alike."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

# Fixed keys: the grammar forces `{"kind":"point","x":` and `,"y":` whatever the model says.
FIXED = {
    "type": "object",
    "properties": {
        "kind": {"const": "point"},
        "x": {"type": "integer", "minimum": 0, "maximum": 9},
        "y": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["kind", "x", "y"],
    "additionalProperties": False,
}
# Free text inside: 20 tokens cannot hold the answer, so budget closing ends it.
LONG = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "age": {"type": "integer", "minimum": 0},
    },
    "required": ["name", "tags", "age"],
}


def _strict(text: str):
    """json.loads that refuses -Infinity, Infinity and NaN (not JSON)."""

    def refuse(name: str):
        raise AssertionError(f"non-JSON number {name} in the response")

    return json.loads(text, parse_constant=refuse)


def _post(server, schema: dict | None, stream: bool = False, **extra) -> httpx.Response:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Describe a person with twenty tags, as JSON."}],
        "max_tokens": 40,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "stream": stream,
    }
    if schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema},
        }
    headers = {"Authorization": f"Bearer {server.api_key}"}
    r = httpx.post(
        server.url + "/v1/chat/completions", json=body | extra, headers=headers, timeout=180
    )
    assert r.status_code == 200, r.text[:800]
    return r


def _whole(server, schema: dict | None, **extra) -> tuple[dict, list[dict], int]:
    data = _strict(_post(server, schema, **extra).text)
    choice = data["choices"][0]
    return choice, choice["logprobs"]["content"], data["usage"]["completion_tokens"]


def _check_entries(entries: list[dict], text: str, completion_tokens: int) -> None:
    assert len(entries) == completion_tokens
    assert "".join(e["token"] for e in entries) == text
    for e in entries:
        assert e["provenance"] in ("sampled", "forced", "closed")
        assert e["logprob"] <= 0
        if e["provenance"] == "closed":  # appended without a draw: certain, no mask count
            assert e["logprob"] == 0 and "allowed_tokens" not in e
            assert [t["token"] for t in e["top_logprobs"]] == [e["token"]]
        else:
            assert e["allowed_tokens"] >= 1
            if e["allowed_tokens"] == 1:  # the mask left no choice
                assert e["provenance"] == "forced" and e["logprob"] == pytest.approx(0, abs=1e-5)
                assert len(e["top_logprobs"]) == 1


def test_fixed_keys_come_as_forced_tokens(server):
    choice, entries, used = _whole(server, FIXED)
    jsonschema.validate(json.loads(choice["message"]["content"]), FIXED)
    _check_entries(entries, choice["message"]["content"], used)
    forced = "".join(e["token"] for e in entries if e["provenance"] == "forced")
    assert "kind" in forced and "point" in forced, entries
    sampled = [e for e in entries if e["provenance"] == "sampled"]
    assert sampled and all(e["allowed_tokens"] > 1 for e in sampled)
    # a digit under "minimum 0, maximum 9": the mask allowed a handful of tokens, not the vocabulary
    assert any(1 < e["allowed_tokens"] < 100 for e in sampled), sampled


def test_a_tight_budget_shows_closed_tokens(server):
    choice, entries, used = _whole(server, LONG, max_tokens=20)
    assert choice["finish_reason"] == "length" and choice["budget_close"]["steered"]
    jsonschema.validate(json.loads(choice["message"]["content"]), LONG)
    _check_entries(entries, choice["message"]["content"], used)
    closed = [e for e in entries if e["provenance"] == "closed"]
    assert closed and entries[-1]["provenance"] == "closed"
    # the closing is one run at the end of the output
    first = entries.index(closed[0])
    assert all(e["provenance"] == "closed" for e in entries[first:])


def test_unconstrained_tokens_are_sampled_from_the_whole_vocabulary(server):
    choice, entries, used = _whole(server, None, max_tokens=8)
    _check_entries(entries, choice["message"]["content"], used)
    assert {e["provenance"] for e in entries} == {"sampled"}
    assert all(e["allowed_tokens"] >= 49152 for e in entries)


def test_streamed_entries_carry_the_same_fields(server):
    r = _post(server, FIXED, stream=True, stream_options={"include_usage": True})
    chunks = [_strict(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    entries, text = [], ""
    for c in chunks:
        for ch in c["choices"]:
            text += ch["delta"].get("content") or ""
            entries += (ch.get("logprobs") or {}).get("content") or []
    whole, whole_entries, used = _whole(server, FIXED)
    _check_entries(entries, text, chunks[-1]["usage"]["completion_tokens"])
    assert text == whole["message"]["content"]
    assert [(e["token"], e["provenance"]) for e in entries] == [
        (e["token"], e["provenance"]) for e in whole_entries
    ]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
        },
    },
}


def test_tool_call_tokens_have_entries_too(server):
    """A tool call's tokens (the call format's markers included) get entries, whole or streamed;
    the call's fixed parts (name, keys) are forced."""
    extra = {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 60}
    msgs = [{"role": "user", "content": "What is the weather in Oslo?"}]
    choice, entries, used = _whole(server, None, messages=msgs, **extra)
    call = choice["message"]["tool_calls"][0]["function"]
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
    assert len(entries) == used
    assert "get_weather" in "".join(e["token"] for e in entries if e["provenance"] == "forced")
    r = _post(
        server, None, stream=True, messages=msgs, stream_options={"include_usage": True}, **extra
    )
    chunks = [_strict(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    streamed = [
        e
        for c in chunks
        for ch in c["choices"]
        for e in (ch.get("logprobs") or {}).get("content") or []
    ]
    assert [(e["token"], e["provenance"]) for e in streamed] == [
        (e["token"], e["provenance"]) for e in entries
    ]
