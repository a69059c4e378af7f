"""Receipts (``corral``) and the constraint endpoints, end to end against a real `corral serve`.

A receipt must tell what really happened to this request's constraint: a first request with a
schema compiles it (``cache: compiled`` and its compile time), the next one hits memory; a
precompiled or validated constraint is a hit for the chat request that follows, including
tools, which are wrapped the same way. A refused constraint is the very 400 a chat request gets.
Outputs are judged by ``jsonschema``. Every schema carries a property name of its own
(``unique``), since the server and its cache are shared by the session's API tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import httpx
import jsonschema
import llguidance
import pytest
from api_server import start_server, stop_server

from corral.grammar import ConstraintSpec
from corral.grammar.schema.closed_objects import close_objects
from corral.schema_cache import entry_key

VALIDATE, PRECOMPILE = "/v1/constraints/validate", "/v1/constraints"


def unique(extra: dict | None = None) -> dict:
    """An object schema never sent before (so its first compile is this test's)."""
    name = "k" + uuid.uuid4().hex[:8]
    props = {name: {"type": "integer", "minimum": 0, "maximum": 9}} | (extra or {})
    return {"type": "object", "properties": props, "required": [name]}


def fmt(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": strict}}


def post(server, path: str, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=300)


def chat_body(server, **kw) -> dict:
    ask = [{"role": "user", "content": "Give a number as JSON."}]
    return {"model": server.model, "messages": ask, "max_tokens": 30} | kw


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    return err


def test_chat_receipt_is_compiled_then_a_memory_hit(server, smol_tok_info) -> None:
    schema = unique()
    client = server.client()
    kw = dict(model=server.model, messages=[{"role": "user", "content": "JSON please"}],
              max_tokens=30, response_format=fmt(schema))  # fmt: skip
    first = client.chat.completions.create(**kw)
    jsonschema.validate(json.loads(first.choices[0].message.content), schema)
    r1 = first.model_extra["corral"]
    assert r1["cache"] == "compiled" and r1["compile_ms"] > 0 and r1["exact"] is True
    assert r1["backend"] == "llguidance" and r1["backend_version"] == llguidance.__version__
    assert r1["unenforced"] == []
    # the digest is the content digest of the constraint as compiled: the closed schema
    closed = close_objects(schema)
    assert closed != schema
    assert r1["digest"] == ConstraintSpec.json_schema(closed).digest
    assert r1["tokenizer"] == smol_tok_info.fingerprint
    assert r1["cache_key"] == entry_key(r1["digest"], r1["tokenizer"])
    param = "response_format.json_schema.schema"
    assert r1["rewrites"] == [{"rewrite": "close_objects", "param": param}]

    second = client.chat.completions.create(**kw).model_extra["corral"]
    assert second["cache"] == "memory" and "compile_ms" not in second
    assert {k: v for k, v in second.items() if k not in ("cache", "compile_ms")} == {
        k: v for k, v in r1.items() if k not in ("cache", "compile_ms")
    }


def test_unconstrained_answers_carry_no_receipt(server) -> None:
    r = post(server, "/v1/chat/completions", chat_body(server, max_tokens=3))
    assert r.status_code == 200 and "corral" not in r.json()
    text = {"type": "text"}
    r = post(server, "/v1/chat/completions", chat_body(server, max_tokens=3, response_format=text))
    assert r.status_code == 200 and "corral" not in r.json()


def test_stream_sends_the_receipt_in_its_first_chunk_only(server) -> None:
    schema = unique()
    stream = server.client().chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "JSON"}], max_tokens=30,
        response_format=fmt(schema), stream=True,
    )  # fmt: skip
    chunks = list(stream)
    receipts = [c.model_extra.get("corral") for c in chunks]
    assert receipts[0] is not None and receipts[0]["cache"] == "compiled"
    assert receipts[1:] == [None] * (len(chunks) - 1)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)


def test_lenient_receipt_lists_what_is_not_enforced(server) -> None:
    schema = {"type": "string", "pattern": "^a(?!x)", "maxLength": 5}
    r = post(server, VALIDATE, {"response_format": fmt(schema, strict=False)})
    assert r.status_code == 200, r.text
    receipt = r.json()["corral"]
    assert receipt["exact"] is False and receipt["rewrites"] == []  # no object to close
    [item] = receipt["unenforced"]
    assert (item["pointer"], item["keyword"]) == ("/pattern", "pattern")
    assert item["param"] == "response_format.json_schema.schema"


ONE_OF = {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}


def keyword_rewrite(param: str, pointer: str, keyword: str, detail: str) -> dict:
    return {"rewrite": "keyword", "param": param, "pointer": pointer, "keyword": keyword,
            "detail": detail}  # fmt: skip


def test_keyword_rewrites_follow_the_request_ones_and_survive_cache_hits(server) -> None:
    """The analysis rewrote the oneOf (its branches are disjoint, so an anyOf): the receipt says
    where, relative to the request field, in the chat that compiled it, in the validate that
    hit the cache, and in a second chat; a schema taken as written lists no keyword rewrite."""
    schema = unique({"v": ONE_OF})
    param = "response_format.json_schema.schema"
    expected = [
        {"rewrite": "close_objects", "param": param},
        keyword_rewrite(param, "/properties/v/oneOf", "oneOf", "oneOf->anyOf (branches disjoint)"),
    ]
    client = server.client()
    kw = dict(model=server.model, messages=[{"role": "user", "content": "JSON please"}],
              max_tokens=30, response_format=fmt(schema))  # fmt: skip
    first = client.chat.completions.create(**kw)
    jsonschema.validate(json.loads(first.choices[0].message.content), schema)
    assert first.model_extra["corral"]["cache"] == "compiled"
    assert first.model_extra["corral"]["rewrites"] == expected
    v = post(server, VALIDATE, {"response_format": fmt(schema)})
    assert v.status_code == 200, v.text
    assert v.json()["corral"]["cache"] == "memory" and v.json()["corral"]["rewrites"] == expected
    second = client.chat.completions.create(**kw)
    jsonschema.validate(json.loads(second.choices[0].message.content), schema)
    assert second.model_extra["corral"]["cache"] == "memory"
    assert second.model_extra["corral"]["rewrites"] == expected

    plain = post(server, VALIDATE, {"response_format": fmt(unique())})
    assert plain.status_code == 200, plain.text
    assert plain.json()["corral"]["rewrites"] == [{"rewrite": "close_objects", "param": param}]


def test_keyword_rewrites_of_a_tool_point_into_its_parameters(server) -> None:
    tools = [
        {"type": "function", "function": {"name": "plain", "parameters": unique()}},
        {"type": "function", "function": {"name": "pick", "parameters": unique({"v": ONE_OF})}},
    ]
    v = post(server, VALIDATE, {"tools": tools, "tool_choice": "required"})
    assert v.status_code == 200, v.text
    rewrites = v.json()["corral"]["rewrites"]
    assert [w["rewrite"] for w in rewrites[:2]] == ["tool_calls", "close_objects"]
    assert rewrites[2:] == [
        keyword_rewrite("tools[1].function.parameters", "/properties/v/oneOf", "oneOf",
                        "oneOf->anyOf (branches disjoint)"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "constraint",
    [
        {"response_format": fmt({"type": "string", "pattern": "a(?!x)"})},  # not enforceable
        {"response_format": fmt({"type": "object", "properties": {"a": {"type": "strin"}}})},
        {"guided_regex": "(unclosed"},
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"x": {"type": "array", "contains": {}}},
                        },
                    },
                }
            ],
            "tool_choice": "required",
        },  # fmt: skip
    ],
)
def test_validate_refuses_exactly_as_chat_does(server, constraint) -> None:
    chat = post(server, "/v1/chat/completions", chat_body(server, **constraint))
    expected = error_of(chat, 400)
    for path in (VALIDATE, PRECOMPILE):
        assert error_of(post(server, path, constraint), 400) == expected
        # ... with the chat body itself too: the endpoints accept it unchanged
        assert error_of(post(server, path, chat_body(server, **constraint)), 400) == expected


def test_precompiled_constraint_is_a_hit_for_chat(server) -> None:
    schema = unique({"note": {"type": "string", "maxLength": 4}})
    r = post(server, PRECOMPILE, {"response_format": fmt(schema)})
    assert r.status_code == 200, r.text
    warmed = r.json()
    assert warmed["object"] == "constraint" and warmed["corral"]["cache"] == "compiled"
    chat = post(server, "/v1/chat/completions", chat_body(server, response_format=fmt(schema)))
    assert chat.status_code == 200, chat.text
    receipt = chat.json()["corral"]
    assert receipt["cache"] == "memory" and receipt["cache_key"] == warmed["corral"]["cache_key"]
    jsonschema.validate(json.loads(chat.json()["choices"][0]["message"]["content"]), schema)


def test_validated_tools_are_a_hit_for_chat(server) -> None:
    params = unique()
    tools = [{"type": "function", "function": {"name": "pick", "parameters": params}}]
    body = {"tools": tools, "tool_choice": "required"}
    v = post(server, VALIDATE, body)
    assert v.status_code == 200, v.text
    receipt = v.json()["corral"]
    assert receipt["kind"] == "structural_tag" and receipt["cache"] == "compiled"
    assert [w["rewrite"] for w in receipt["rewrites"]] == ["tool_calls", "close_objects"]
    chat = post(server, "/v1/chat/completions", chat_body(server, max_tokens=30, **body))
    assert chat.status_code == 200, chat.text
    answer = chat.json()
    assert answer["corral"]["cache"] == "memory"
    assert answer["corral"]["digest"] == receipt["digest"]
    for call in answer["choices"][0]["message"].get("tool_calls") or ():
        jsonschema.validate(json.loads(call["function"]["arguments"]), params)


def test_completions_and_responses_carry_receipts(server) -> None:
    schema = unique()
    body = {"model": server.model, "prompt": "JSON:", "max_tokens": 30,
            "response_format": fmt(schema)}  # fmt: skip
    done = post(server, "/v1/completions", body)
    assert done.status_code == 200, done.text
    assert done.json()["corral"]["cache"] == "compiled"
    jsonschema.validate(json.loads(done.json()["choices"][0]["text"]), schema)
    text = {"format": {"type": "json_schema", "name": "r", "schema": schema, "strict": True}}
    resp = post(server, "/v1/responses", {"model": server.model, "input": "JSON", "text": text,
                                          "max_output_tokens": 30})  # fmt: skip
    assert resp.status_code == 200, resp.text
    receipt = resp.json()["corral"]
    assert receipt["digest"] == done.json()["corral"]["digest"] and receipt["cache"] == "memory"
    assert receipt["rewrites"] == [{"rewrite": "close_objects", "param": "text.format.schema"}]


@pytest.mark.parametrize(
    "body",
    [
        [1],
        {},  # no constraint
        {"response_format": {"type": "text"}},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"},
        {"response_format": {"type": "json_schema"}},
        {"response_format": fmt({"type": "object"}), "surprise": 1},
        {"response_format": fmt({"type": "object"}), "model": "not-the-model"},
        {"response_format": fmt({"type": "object"}), "guided_regex": "a"},
        {"response_format": "json"},
    ],
)
def test_invalid_bodies_are_openai_shaped_4xx(server, body) -> None:
    for path in (VALIDATE, PRECOMPILE):
        r = httpx.post(server.url + path, json=body, timeout=60,
                       headers={"Authorization": f"Bearer {server.api_key}"})  # fmt: skip
        assert r.status_code in (400, 404), r.text
        error_of(r, r.status_code)


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_hostile_schemas_are_4xx_never_5xx(server) -> None:
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(6000)}}
    for schema in (nested(200), wide):
        r = post(server, VALIDATE, {"response_format": fmt(schema)})
        assert error_of(r, 400)["code"] == "constraint_too_complex"
    text = json.dumps({"response_format": fmt({})}).replace("{}", "[" * 100_000 + "]" * 100_000)
    for path in (VALIDATE, PRECOMPILE):
        r = httpx.post(server.url + path, content=text.encode(), timeout=60,
                       headers={"Authorization": f"Bearer {server.api_key}",
                                "Content-Type": "application/json"})  # fmt: skip
        assert 400 <= r.status_code < 500, r.text[:300]
    garbage = httpx.post(server.url + VALIDATE, content=b"{not json", timeout=60,
                         headers={"Authorization": f"Bearer {server.api_key}",
                                  "Content-Type": "application/json"})  # fmt: skip
    error_of(garbage, 400)
    error_of(post(server, VALIDATE, {"response_format": fmt({})}, key="wrong"), 401)


def _warm(*args: str) -> subprocess.CompletedProcess:
    """``corral cache warm`` with none of the server settings from this environment."""
    cmd = [sys.executable, "-m", "corral.cli", "cache", "warm", "--no-progress", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def test_cache_warm_url_warms_the_running_server(server, tmp_path) -> None:
    schemas = [unique(), unique()]
    for i, s in enumerate(schemas):
        (tmp_path / f"s{i}.json").write_text(json.dumps(s))
    (tmp_path / "refused.json").write_text(json.dumps({"type": "string", "pattern": "a(?!x)"}))
    out = _warm(str(tmp_path), "--url", server.url, "--api-key", server.api_key)
    assert out.returncode == 0, out.stderr
    assert "3 schemas from 3 files for the server at" in out.stdout
    assert "2 compiled, 0 already cached, 1 refused, 0 errors" in out.stdout
    assert "negative look-ahead" in out.stdout  # the 400's message
    for s in schemas:
        chat = post(server, "/v1/chat/completions", chat_body(server, response_format=fmt(s)))
        assert chat.json()["corral"]["cache"] == "memory"
    wrong_key = _warm(str(tmp_path), "--url", server.url, "--api-key", "nope")
    assert wrong_key.returncode == 1 and "3 errors" in wrong_key.stdout


def test_cache_warm_model_writes_entries_the_server_hits(model_folder, tmp_path) -> None:
    """Without --url, warm compiles in its own process for the served model's tokenizer and the
    server's object closing: a server started on that cache finds the entries on disk."""
    cache = tmp_path / "cache"
    cache.mkdir()
    models = cache / "models"
    models.symlink_to(model_folder.parent, target_is_directory=True)  # as start_server links it
    schema = unique()  # its objects are closed by the server: the warm must close them too
    (tmp_path / "s.json").write_text(json.dumps(schema))
    out = _warm(str(tmp_path / "s.json"), "--cache-dir", str(cache))
    assert out.returncode == 0, out.stderr
    assert "1 schemas from 1 files" in out.stdout and "1 compiled" in out.stdout
    models.unlink()  # start_server links it again
    srv = start_server(model_folder, cache, ("--max-concurrent", "1", "--memory", "128MB"))
    try:
        chat = post(srv, "/v1/chat/completions", chat_body(srv, response_format=fmt(schema)))
        assert chat.status_code == 200, chat.text
        assert chat.json()["corral"]["cache"] == "disk"
    finally:
        stop_server(srv)
