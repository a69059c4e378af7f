"""Unicode through every constraint path of a real `corral serve`, as a user who does not write
English sends it: hypothesis draws non-ASCII strings (multi-byte, astral, combining marks,
right-to-left, characters JSON escapes; `corral.fuzz.unicode`) into property values, enum
members, keys, patterns, choices, tool arguments and prompts, and drives them through
json_schema, json_object, regex, choice, structural tags, tools (required, auto, named),
reasoning, `/v1/responses`, `/v1/completions` and SGLang's `/generate`, streamed and not, at budgets from below the
shortest instance to ample, with the real default model and tokenizer.

Every answer is a 200 (never a 5xx, never an error event in a stream) whose output validates
(jsonschema or the regex judges), or, when `max_tokens` ran out, is honestly cut: finish reason
"length" and no budget report claiming a complete instance. A tool name outside OpenAI's
``^[a-zA-Z0-9_-]{1,64}$`` is a 400 naming the field, as it is on OpenAI's API.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.fuzz.unicode import regex_literal, unicode_choices, unicode_schemas, unicode_text

PATHS = (
    "json_schema", "json_object", "regex", "choice", "structural_tag", "tools_required",
    "tools_auto", "tools_named", "reasoning", "responses", "completions", "generate",
    "generate_regex",
)  # fmt: skip
BUDGETS = st.one_of(st.integers(1, 12), st.integers(13, 96))  # below the shortest ... ample
SETTINGS = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _post(server, path: str, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    data = json.dumps(body, ensure_ascii=False).encode()
    return httpx.post(server.url + path, content=data, headers=headers, timeout=300)


def _stream(server, path: str, body: dict) -> tuple[int, list[dict], str]:
    """Status, the stream's JSON events in order, and the raw text (for messages)."""
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    data = json.dumps(body | {"stream": True}, ensure_ascii=False).encode()
    with httpx.stream("POST", server.url + path, content=data, headers=headers, timeout=300) as r:
        raw = r.read().decode()
    if r.status_code != 200:
        return r.status_code, [], raw
    # SSE ends lines at CR and LF only (the server escapes U+2028 and its kin: httpx's
    # iter_lines would split there); a data line that is not one JSON value fails here
    lines = [ln[6:] for ln in re.split(r"\r\n|\r|\n", raw) if ln.startswith("data: ")]
    assert not re.search("[\x85\u2028\u2029]", raw), raw[-400:]
    if not path.endswith("responses"):  # chat, completions and /generate streams end so
        assert lines and lines[-1] == "[DONE]", raw[-600:]
    return r.status_code, [json.loads(x) for x in lines if x != "[DONE]"], raw


# -- the outcome of one request, read the same way streamed or not -----------------------------


class Outcome:
    """What a choice produced: its text (or the answer after a think block), tool calls as
    (name, arguments text), finish reason and budget report."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: list[list[str]] = []
        self.finish: str | None = None
        self.budget: dict | None = None

    def cut(self) -> bool:
        """Whether max_tokens ended it without a budget report claiming a complete output."""
        return self.finish == "length" and not (self.budget or {}).get("complete")


def _chat_message(body: dict) -> Outcome:
    out, choice = Outcome(), body["choices"][0]
    msg = choice["message"]
    out.text, out.finish, out.budget = msg.get("content") or "", choice["finish_reason"], None
    out.budget = choice.get("budget_close")
    for call in msg.get("tool_calls") or []:
        out.calls.append([call["function"]["name"], call["function"]["arguments"]])
    return out


def _chat_chunks(events: list[dict]) -> Outcome:
    out = Outcome()
    for ev in events:
        assert "error" not in ev, ev
        for choice in ev.get("choices") or []:
            delta = choice.get("delta") or {}
            out.text += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                while len(out.calls) <= call["index"]:
                    out.calls.append(["", ""])
                fn = call.get("function") or {}
                out.calls[call["index"]][0] += fn.get("name") or ""
                out.calls[call["index"]][1] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                out.finish, out.budget = choice["finish_reason"], choice.get("budget_close")
    return out


def _completion(body: dict | None, events: list[dict]) -> Outcome:
    out = Outcome()
    for part in [body] if body is not None else events:
        assert "error" not in part, part
        choice = part["choices"][0] if part.get("choices") else None
        if choice is not None:
            out.text += choice.get("text") or ""
            out.finish = choice.get("finish_reason") or out.finish
            out.budget = choice.get("budget_close") or out.budget
    return out


def _generate(bodies: list[dict]) -> Outcome:
    """SGLang's `/generate`: each streamed event carries the text so far; the last says how
    it ended (it reports no budget closing, so "length" is a cut)."""
    out = Outcome()
    for part in bodies:
        assert "error" not in part, part
        assert part["text"].startswith(out.text), (part["text"], out.text)  # cumulative
        out.text = part["text"]
        finish = part["meta_info"].get("finish_reason")
        out.finish = finish["type"] if finish else out.finish
    return out


def _response(body: dict) -> Outcome:
    out = Outcome()
    for item in body["output"]:
        if item["type"] == "message":
            out.text += "".join(p.get("text", "") for p in item["content"])
    incomplete = (body.get("incomplete_details") or {}).get("reason")
    out.finish = "length" if incomplete == "max_output_tokens" else "stop"
    return out


def _responses_stream(events: list[dict]) -> Outcome:
    assert all(e["type"] not in ("error", "response.failed") for e in events), events[-1]
    ends = ("response.completed", "response.incomplete")
    final = next(e["response"] for e in reversed(events) if e["type"] in ends)
    out = _response(final)
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert streamed == out.text, (streamed, out.text)
    return out


# -- one request of each path ------------------------------------------------------------------


def _tool(schema: dict, name: str = "lookup") -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": "Looks it up", "parameters": schema},
    }


def _case(path: str, data: st.DataObject) -> tuple[str, dict, Any]:
    """(endpoint, body without model/max_tokens, judge of an Outcome's output)."""
    words = data.draw(unicode_text(1, 8))
    prompt = f"Réponds en JSON — 答えて: {words}"
    schema = data.draw(unicode_schemas())
    validator = jsonschema.Draft202012Validator(schema)

    def valid_json(text: str) -> bool:
        try:
            return validator.is_valid(json.loads(text))
        except ValueError:
            return False

    chat = {"messages": [{"role": "user", "content": prompt}]}
    if path in ("json_schema", "reasoning"):
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": schema, "strict": True},
        }
        return "/v1/chat/completions", chat | {"response_format": fmt}, valid_json
    if path == "json_object":
        fmt = {"type": "json_object"}

        def is_object(text: str) -> bool:
            try:
                return isinstance(json.loads(text), dict)
            except ValueError:
                return False

        return "/v1/chat/completions", chat | {"response_format": fmt}, is_object
    if path in ("regex", "choice"):
        choices = data.draw(unicode_choices())
        if path == "choice":
            fmt = {"type": "choice", "choice": choices}
            return "/v1/chat/completions", chat | {"response_format": fmt}, choices.__contains__
        alt = "(?:" + "|".join(regex_literal(c) for c in choices) + ")"
        pattern = f"{alt}(?: {alt}){{0,2}} [0-9]{{1,3}}"
        fmt = {"type": "regex", "regex": pattern}
        judge = re.compile(pattern).fullmatch
        return "/v1/chat/completions", chat | {"response_format": fmt}, judge
    if path == "structural_tag":
        begin = "<" + data.draw(unicode_text(1, 3, escaped=False)).replace(">", "") + ">"
        fmt = {
            "type": "structural_tag",
            "structures": [{"begin": begin, "schema": schema, "end": "</>"}],
            "triggers": ["<"],
        }

        def segments_valid(text: str) -> bool:
            parts = text.split(begin)[1:]
            return all(p.count("</>") >= 1 and valid_json(p.split("</>")[0]) for p in parts)

        return "/v1/chat/completions", chat | {"response_format": fmt}, segments_valid
    if path.startswith("tools_"):
        choice: Any = {"required": "required", "auto": "auto"}.get(path[6:])
        if choice is None:
            choice = {"type": "function", "function": {"name": "lookup"}}
        body = chat | {"tools": [_tool(schema)], "tool_choice": choice}
        return "/v1/chat/completions", body, valid_json
    if path == "responses":
        fmt = {"type": "json_schema", "name": "r", "schema": schema, "strict": True}
        return "/v1/responses", {"input": prompt, "text": {"format": fmt}}, valid_json
    if path.startswith("generate"):
        params: dict[str, Any] = {"json_schema": json.dumps(schema, ensure_ascii=False)}
        judge: Any = valid_json
        if path == "generate_regex":
            alt = "(?:" + "|".join(regex_literal(c) for c in data.draw(unicode_choices())) + ")"
            params, judge = {"regex": f"{alt}+"}, re.compile(f"{alt}+").fullmatch
        return "/generate", {"text": prompt + "\n", "sampling_params": params}, judge
    assert path == "completions"
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    return "/v1/completions", {"prompt": prompt + "\n", "response_format": fmt}, valid_json


def _judge(path: str, out: Outcome, judge: Any) -> None:
    if path.startswith("tools_"):
        if path == "tools_auto" and not out.calls:
            return  # free text is a valid answer when the model may choose
        if not out.calls:
            assert out.cut(), vars(out)
            return
        for i, (name, args) in enumerate(out.calls):
            assert name == "lookup", vars(out)
            last = i == len(out.calls) - 1
            assert judge(args) or (last and out.cut()), vars(out)
        return
    assert judge(out.text) or out.cut(), vars(out)


def _run(server, path: str, data: st.DataObject) -> None:
    endpoint, body, judge = _case(path, data)
    limit = data.draw(BUDGETS, label="max_tokens")
    stream = data.draw(st.booleans(), label="stream")
    if endpoint == "/generate":
        body["sampling_params"] |= {"max_new_tokens": limit, "temperature": 1.0}
    else:
        budget_key = "max_output_tokens" if endpoint.endswith("responses") else "max_tokens"
        body |= {"model": server.model, budget_key: limit, "temperature": 1.0}
    if not endpoint.endswith("responses") and endpoint != "/generate":
        body["seed"] = data.draw(st.integers(0, 2**16), label="seed")
    if stream:
        status, events, raw = _stream(server, endpoint, body)
        assert status == 200, raw[-800:]
        if endpoint == "/generate":
            out = _generate(events)
        elif endpoint.endswith("responses"):
            out = _responses_stream(events)
        elif endpoint.endswith("chat/completions"):
            out = _chat_chunks(events)
        else:
            out = _completion(None, events)
    else:
        r = _post(server, endpoint, body)
        assert r.status_code == 200, r.text[:800]
        if endpoint == "/generate":
            out = _generate([r.json()])
        elif endpoint.endswith("responses"):
            out = _response(r.json())
        elif endpoint.endswith("chat/completions"):
            out = _chat_message(r.json())
        else:
            out = _completion(r.json(), [])
    _judge(path, out, judge)


@pytest.mark.timeout(1800)  # ~30 requests; several minutes on a loaded 2-core machine
@SETTINGS
@given(path=st.sampled_from([p for p in PATHS if p != "reasoning"]), data=st.data())
def test_unicode_through_every_constraint_path(server, path, data):
    _run(server, path, data)


@settings(SETTINGS, max_examples=8)
@given(data=st.data())
def test_unicode_after_a_think_block(r1_server, data):
    """A reasoning model's answer: the constraint applies after the block ends."""
    _run(r1_server, "reasoning", data)


@pytest.mark.parametrize("name", ["天気", "météo", "get weather", "a" * 65])
def test_a_tool_name_outside_openai_rules_is_refused(server, name):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "天気は？"}],
        "tools": [_tool(schema, name)],
        "tool_choice": "required",
        "max_tokens": 8,
    }
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text[:800]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "tools" in (err["param"] or ""), err


@pytest.mark.parametrize(
    "endpoint", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate"]
)
def test_line_separators_in_a_streamed_answer_keep_each_event_on_one_line(server, endpoint):
    """U+2028, U+2029 and U+0085 end a line for `str.splitlines`, which httpx's `iter_lines`
    uses: streamed raw inside the JSON, they cut an event in two. Each event the server streams
    reads back through `iter_lines` as one JSON value, and the answer keeps the characters."""
    answer = "a\u2028b\u2029c\x85d"
    if endpoint == "/generate":
        body = {"text": "Say it.\n", "sampling_params": {"regex": regex_literal(answer)}}
    else:
        fmt = {"type": "regex", "regex": regex_literal(answer)}
        body = {"model": server.model, "response_format": fmt, "max_tokens": 32}
        if endpoint == "/v1/responses":
            fmt = {"type": "json_schema", "name": "a", "schema": {"const": answer}}
            body = {"model": server.model, "input": "Say it.", "text": {"format": fmt}}
        elif endpoint.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": "Say it."}]
        else:
            body["prompt"] = "Say it.\n"
    headers = {"Authorization": f"Bearer {server.api_key}"}
    with httpx.stream(
        "POST", server.url + endpoint, json=body | {"stream": True}, headers=headers, timeout=120
    ) as r:
        assert r.status_code == 200
        data = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    events = [json.loads(d) for d in data if d != "[DONE]"]  # each line one JSON value
    text = json.dumps(events, ensure_ascii=False)
    assert all(ch in text for ch in "\u2028\u2029\x85"), text[-600:]
