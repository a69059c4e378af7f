"""The hostile-input sweep against a real `corral serve`.

Every input below is a client mistake or a valid but extreme request. Each must be answered
within 5 s with the documented 4xx, or served with output that holds: finish "stop" content that
validates (jsonschema, or the regex / the grammar's sentences), or "length" for constraints whose
shortest instance is longer than `max_tokens`. Never a 500, never a 200 "stop" with content that
does not validate. Meanwhile a watcher pings `/health`: no input may stall the server, and it is
healthy and serving afterwards.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import jsonschema
import pytest

ANSWER_S = 5.0  # every hostile input is answered within this
STALL_S = 2.0  # /health never takes longer than this meanwhile


@dataclass(frozen=True)
class Case:
    name: str
    body: Callable[[str], dict | bytes]  # model id -> JSON body (or raw bytes)
    expect: str  # "400", "413", "valid" (200, output judged), "valid-or-400", "length-or-400"
    judge: Callable[[str], bool] | None = None  # for non-JSON-schema constraints
    code: str | None = None  # the 4xx's `code`, when the case names one


def nested(depth: int) -> dict:
    node: dict = {"type": "integer"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


def deep_body(depth: int) -> Callable[[str], bytes]:
    """A chat body whose schema nests `depth` objects, as text: Python's json cannot write it."""
    schema = '{"type":"object","required":["a"],"properties":{"a":' * depth
    schema += '{"type":"integer"}' + "}}" * depth

    def make(model: str) -> bytes:
        fmt = '{"type":"json_schema","json_schema":{"name":"x","schema":' + schema + "}}"
        head = json.dumps({"model": model, "messages": [{"role": "user", "content": "Answer."}],
                           "max_tokens": 24})  # fmt: skip
        return (head[:-1] + ', "response_format": ' + fmt + "}").encode()

    return make


def chat(schema=None, fmt=None, content="Answer.", max_tokens=24, **kw) -> Callable[[str], dict]:
    def make(model: str) -> dict:
        body = {"model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "temperature": 0} | kw  # fmt: skip
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}  # fmt: skip
        elif fmt is not None:
            body["response_format"] = fmt
        return body

    return make


def optional_props(n: int, leaf: dict) -> dict:
    return {"type": "object", "properties": {f"p{i}": dict(leaf) for i in range(n)}}


def choice_judge(options: list[str]) -> Callable[[str], bool]:
    allowed = set(options)
    return lambda text: text in allowed


def regex_judge(pattern: str) -> Callable[[str], bool]:
    return lambda text: re.fullmatch(pattern, text) is not None


LARK_WORDS = [f"w{i}x" for i in range(3200)]
EBNF_WORDS = [f"v{i}y" for i in range(20000)]
TOOL_600 = {"type": "function", "function": {"name": "wide", "parameters": optional_props(
    600, {"type": "string", "maxLength": 8})}}  # fmt: skip

CASES = [
    Case("body-10MB", lambda m: chat(content="x" * (10 << 20))(m), "413"),
    Case("non-utf8-body", lambda m: b'{"model": "' + m.encode() + b'", "x": "\xff\xfe"}', "400"),
    Case("not-json", lambda m: b"{not json", "400"),
    Case(
        "body-nested-100000",
        lambda m: b'{"model": "x", "messages": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        "400",
    ),  # fmt: skip
    Case("schema-5000-deep", deep_body(5000), "400"),
    Case("schema-500-deep", deep_body(500), "400"),
    Case("schema-64-deep", chat(nested(64)), "valid-or-400"),
    Case("schema-12-deep", chat(nested(12), max_tokens=80), "valid"),
    Case(
        "catastrophic-pattern",
        chat({"type": "string", "pattern": "^(a+)+$", "maxLength": 8}),
        "valid",
    ),  # fmt: skip
    Case("invalid-regex", chat(fmt={"type": "regex", "regex": "([a-z]"}), "400"),
    Case("invalid-pattern", chat({"type": "string", "pattern": "(unclosed"}), "400"),
    Case("huge-enum", chat({"enum": [f"e{i}" for i in range(200_000)]}), "400"),
    Case("enum-3000", chat({"enum": [f"e{i}" for i in range(3000)]}), "valid"),
    Case("minLength-1e9", chat({"type": "string", "minLength": 10**9}), "length-or-400"),
    Case("lone-surrogate-content", chat(content="hi \ud800 there"), "400"),
    Case("lone-surrogate-enum", chat({"enum": ["ok", "\ud800"]}), "400"),
    Case("lone-surrogate-description", chat({"type": "string", "description": "\udfff"}), "400"),
    Case("lone-surrogate-pattern", chat({"type": "string", "pattern": "^\ud800$"}), "400"),
    Case("n-1000", chat(n=1000), "400"),
    Case(
        "prompt-over-context", chat(content="hello " * 20000), "400", code="context_length_exceeded"
    ),  # fmt: skip
    Case("max-tokens-string", chat(max_tokens="5"), "400"),
    Case("unknown-field", chat(frobnicate=True), "400"),
    Case(
        "ref-cycle",
        chat(
            {
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/a"}},
                "required": ["x"],
                "$defs": {"a": {"$ref": "#/$defs/a"}},
            }
        ),
        "400",
    ),  # fmt: skip
    Case("ref-root", chat({"$ref": "#"}), "400"),
    Case("no-valid-instance", chat({"type": "integer", "minimum": 5, "maximum": 1}), "400"),
    Case("501-optional-props", chat(optional_props(501, {"type": "integer"})), "valid-or-400"),
    Case(
        "800-maxLength-strings",
        chat(optional_props(800, {"type": "string", "maxLength": 5})),
        "valid-or-400",
    ),  # fmt: skip
    Case(
        "anyOf-2500",
        chat(
            {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {f"k{i}": {"type": "integer"}},
                        "required": [f"k{i}"],
                    }
                    for i in range(2500)
                ]
            }
        ),
        "valid-or-400",
    ),  # fmt: skip
    Case(
        "minItems-100000",
        chat({"type": "array", "minItems": 100000, "items": {"const": 1}}),
        "length-or-400",
    ),  # fmt: skip
    Case("regex-a1e6", chat(fmt={"type": "regex", "regex": "a{1000000}"}), "length-or-400"),
    Case(
        "regex-nested-rep", chat(fmt={"type": "regex", "regex": "(a{1000}){1000}"}), "length-or-400"
    ),  # fmt: skip
    Case("pattern-a1e6", chat({"type": "string", "pattern": "^a{1000000}$"}), "length-or-400"),
    Case(
        "lark-3200-alternatives",
        chat(
            fmt={
                "type": "grammar",
                "syntax": "lark",
                "grammar": "start: " + " | ".join(f'"{w}"' for w in LARK_WORDS),
            }
        ),
        "valid-or-400",
        choice_judge(LARK_WORDS),
    ),  # fmt: skip
    Case(
        "ebnf-20000-alternatives",
        chat(
            fmt={
                "type": "grammar",
                "grammar": "root ::= " + " | ".join(f'"{w}"' for w in EBNF_WORDS),
            }
        ),
        "valid-or-400",
        choice_judge(EBNF_WORDS),
    ),  # fmt: skip
    Case(
        "choice-5000",
        chat(fmt={"type": "choice", "choice": EBNF_WORDS[:5000]}),
        "valid",
        choice_judge(EBNF_WORDS[:5000]),
    ),  # fmt: skip
    Case(
        "regex-valid",
        chat(fmt={"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"}),
        "valid",
        regex_judge("[0-9]{3}-[a-z]{2}"),
    ),  # fmt: skip
    Case(
        "tool-600-optional",
        chat(tools=[TOOL_600], tool_choice="required", max_tokens=40),
        "valid-or-400",
    ),  # fmt: skip
    Case(
        "logprobs-under-schema",
        chat(
            {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
            logprobs=True,
            top_logprobs=5,
        ),
        "valid",
    ),  # fmt: skip
]


class Watcher:
    """Pings /health from a thread; `worst` is the slowest answer (inf if one failed)."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self._stop = url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                ok = httpx.get(self.url + "/health", timeout=30).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.worst = max(self.worst, time.monotonic() - t0 if ok else math.inf)
            self._stop.wait(0.2)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def send(server, case: Case) -> httpx.Response:
    body = case.body(server.model)
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + "/v1/chat/completions", content=raw, headers=headers,
                      timeout=120)  # fmt: skip


def check_output(case: Case, body: dict, reply: dict) -> None:
    for choice in reply["choices"]:
        finish, message = choice["finish_reason"], choice["message"]
        assert finish in ("stop", "length", "tool_calls"), finish
        if case.expect == "length-or-400":
            assert finish == "length", f"{case.name}: {finish} {message}"
            continue
        if finish == "length":
            continue  # a valid prefix cut by max_tokens
        if message.get("tool_calls"):
            schema = TOOL_600["function"]["parameters"]
            for call in message["tool_calls"]:
                jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
            continue
        text = message["content"]
        fmt = body.get("response_format", {})
        if fmt.get("type") == "json_schema":
            jsonschema.validate(json.loads(text), fmt["json_schema"]["schema"],
                                cls=jsonschema.Draft202012Validator)  # fmt: skip
        else:
            assert case.judge is not None and case.judge(text), f"{case.name}: {text!r}"
        for lp in (choice.get("logprobs") or {}).get("content") or []:
            assert math.isfinite(lp["logprob"])
            assert all(math.isfinite(t["logprob"]) for t in lp["top_logprobs"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input_is_answered_fast_and_honestly(server, case: Case) -> None:
    with Watcher(server.url) as w:
        t0 = time.monotonic()
        r = send(server, case)
        took = time.monotonic() - t0
    assert r.status_code != 500 and r.status_code < 500, r.text[:500]
    assert took < ANSWER_S, f"{case.name} took {took:.1f} s"
    assert w.worst < STALL_S, f"/health took {w.worst:.1f} s during {case.name}"
    allowed = {"400": {400}, "413": {413}, "valid": {200}}.get(case.expect, {200, 400})
    assert r.status_code in allowed, f"{case.name}: {r.status_code} {r.text[:500]}"
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "param", "code"} and err["code"], err
        if case.code:
            assert err["code"] == case.code, err
    else:
        body = case.body(server.model)
        check_output(case, body, r.json())
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_the_server_still_serves_after_the_sweep(server) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = send(server, Case("after", chat(schema), "valid"))
    assert r.status_code == 200, r.text
    reply = r.json()["choices"][0]
    assert reply["finish_reason"] == "stop"
    jsonschema.validate(json.loads(reply["message"]["content"]), schema)
