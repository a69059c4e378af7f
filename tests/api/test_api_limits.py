"""Limits with clear 400s, against a real `corral serve`.

Each limit is refused within 5 s, before any compile, with a 400 naming the field (`param`),
the limit (`limit`) and the configured bound; a server started with lowered limits (flags and
an environment variable) refuses what the default server serves. Lone surrogates anywhere in a
request are a 400 naming where they are. The walks behind the limits are iterative: a schema
5,000 levels deep is measured, not a RecursionError.
"""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pytest
from api_server import start_server, stop_server

from corral.api.config import ServerConfig
from corral.api.schema_stats import schema_stats
from corral.grammar.core.input_checks import lone_surrogate_path

ANSWER_S = 5.0
DEFAULTS = ServerConfig()


def nested(depth: int) -> dict:
    """Objects nested ``depth`` levels (JSON nesting of the document: 2 * depth + 1)."""
    node: dict = {"type": "integer"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


def props(n: int, prefix: str = "p") -> dict:
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(n)}}


def tool(name: str, parameters: dict | None = None, description: str = "") -> dict:
    fn = {"name": name, "description": description, "parameters": parameters or {"type": "object"}}
    return {"type": "function", "function": fn}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def post(server, body: dict, path: str = "/v1/chat/completions") -> tuple[httpx.Response, float]:
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    t0 = time.monotonic()
    r = httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=120)
    return r, time.monotonic() - t0


def chat(server, content: str = "Answer.", **kw) -> dict:
    body = {"model": server.model, "messages": [{"role": "user", "content": content}]}
    return body | {"max_tokens": 24, "temperature": 0} | kw


def refused(server, body: dict, param: str, code: str, limit: str, bound: int) -> dict:
    r, took = post(server, body)
    assert r.status_code == 400, r.text[:800]
    assert took < ANSWER_S, took
    err = r.json()["error"]
    assert (err["param"], err["code"], err.get("limit")) == (param, code, limit), err
    assert f"{bound:,}" in err["message"] and limit in err["message"], err["message"]
    return err


# -- the walks (in process) ----------------------------------------------------------------------


def test_schema_stats_measure_a_schema_5000_levels_deep_without_recursion() -> None:
    stats = schema_stats(nested(5000))
    assert stats.depth == 2 * 5000 + 1
    assert stats.properties == 5000
    assert stats.deepest[:4] == ("properties", "a", "properties", "a")


def test_schema_stats_size_is_the_compact_json_size() -> None:
    schema = {"type": "object", "properties": {"é": {"enum": ["x", None, True, 1.5, -3]},
              "properties": {"items": [{"const": {"k": [1, 2]}}]}}, "required": ["é"]}  # fmt: skip
    stats = schema_stats(schema)
    compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode()
    assert stats.size == len(compact)
    assert (stats.properties, stats.enum_values) == (2, 5)  # "properties" is a property name


def test_lone_surrogate_path_finds_strings_and_keys_deep_down() -> None:
    deep: object = json.loads('"fine \\ud83d\\ude00"')  # JSON joins a proper pair: fine
    for _ in range(900):
        deep = [deep]
    assert lone_surrogate_path({"a": deep}) is None
    assert lone_surrogate_path({"a": [{"b": "x\udfff"}]}) == (("a", 0, "b"), False)
    assert lone_surrogate_path({"a": {"\ud800": 1}}) == (("a",), True)


# -- each limit against the default server --------------------------------------------------------

SCHEMA = "response_format.json_schema.schema"
LIMIT_CASES = [
    ("depth-81", {"response_format": schema_format(nested(40))}, SCHEMA,
     "constraint_too_complex", "max_schema_depth", DEFAULTS.max_schema_depth),
    ("depth-901", {"response_format": schema_format(nested(450))}, SCHEMA,
     "constraint_too_complex", "max_schema_depth", DEFAULTS.max_schema_depth),
    ("properties", {"response_format": schema_format(props(5001))}, SCHEMA,
     "constraint_too_complex", "max_schema_properties", DEFAULTS.max_schema_properties),
    ("enum", {"response_format": schema_format({"enum": list(range(10001))})}, SCHEMA,
     "constraint_too_complex", "max_enum_values", DEFAULTS.max_enum_values),
    ("bytes", {"response_format": schema_format({"type": "string", "description": "x" * (1 << 20)})},
     SCHEMA, "constraint_too_complex", "max_schema_bytes", DEFAULTS.max_schema_bytes),
    ("choices", {"guided_choice": [f"c{i}" for i in range(10001)]}, "guided_choice",
     "constraint_too_complex", "max_enum_values", DEFAULTS.max_enum_values),
    ("regex-bytes", {"guided_regex": "a" * (1 << 20) + "b"}, "guided_regex",
     "constraint_too_complex", "max_schema_bytes", DEFAULTS.max_schema_bytes),
    ("tools", {"tools": [tool(f"f{i}") for i in range(129)], "tool_choice": "none"}, "tools",
     "invalid_value", "max_tools", DEFAULTS.max_tools),
    ("tools-properties", {"tools": [tool("f", props(2600, "a")), tool("g", props(2600, "b"))]},
     "tools[1].function.parameters", "constraint_too_complex", "max_schema_properties",
     DEFAULTS.max_schema_properties),
    ("n", {"n": 9}, "n", "invalid_value", "max_n", DEFAULTS.max_n),
    ("n-1000", {"n": 1000}, "n", "invalid_value", "max_n", DEFAULTS.max_n),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param", "code", "limit", "bound"),
                         [c[1:] for c in LIMIT_CASES], ids=[c[0] for c in LIMIT_CASES])  # fmt: skip
def test_each_limit_is_a_clear_400(server, fields, param, code, limit, bound) -> None:
    refused(server, chat(server) | fields, param, code, limit, bound)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_the_pointer_says_where_a_schema_goes_too_deep(server) -> None:
    body = chat(server, response_format=schema_format(nested(40)))
    err = refused(server, body, SCHEMA, "constraint_too_complex", "max_schema_depth", 64)
    assert err["pointer"] == "/properties/a" * 32  # the object at level 65


def test_within_the_limits_the_output_validates(server) -> None:
    schema = nested(12)  # 25 levels
    r, _ = post(server, chat(server, max_tokens=80, response_format=schema_format(schema)))
    reply = r.json()
    assert r.status_code == 200 and reply["choices"][0]["finish_reason"] == "stop", r.text[:500]
    jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), schema)


def test_prompt_plus_max_tokens_beyond_the_context(server) -> None:
    r, _ = post(server, chat(server, max_tokens=9000))
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["param"]) == (400, "context_length_exceeded",
                                                          "max_tokens"), err  # fmt: skip


# -- lone surrogates ------------------------------------------------------------------------------

SURROGATES = [
    ("content", lambda s: chat(s, "hi \ud800 there"), "messages[0].content"),
    ("schema-enum", lambda s: chat(s, response_format=schema_format({"enum": ["ok", "\ud800"]})),
     SCHEMA + ".enum[1]"),
    ("schema-key", lambda s: chat(s, response_format=schema_format(
        {"type": "object", "properties": {"\udc00": {}}})), SCHEMA + ".properties"),
    ("schema-description", lambda s: chat(s, response_format=schema_format(
        {"type": "string", "description": "\udfff"})), SCHEMA + ".description"),
    ("pattern", lambda s: chat(s, response_format=schema_format(
        {"type": "string", "pattern": "^\ud800$"})), SCHEMA + ".pattern"),
    ("stop", lambda s: chat(s, stop=["ok", "\ud800"]), "stop[1]"),
    ("tool", lambda s: chat(s, tools=[tool("f", description="\ud800")]),
     "tools[0].function.description"),
    ("guided_choice", lambda s: chat(s, guided_choice=["a", "\ud800"]), "guided_choice[1]"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "param"), [c[1:] for c in SURROGATES],
                         ids=[c[0] for c in SURROGATES])  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_where(server, make, param) -> None:
    r, took = post(server, make(server))
    assert r.status_code == 400 and took < ANSWER_S, r.text[:500]
    err = r.json()["error"]
    assert err["param"] == param and "surrogate" in err["message"], err


def test_a_lone_surrogate_in_a_completions_prompt(server) -> None:
    body = {"model": server.model, "prompt": ["fine", "bad \ud800"], "max_tokens": 2}
    r, _ = post(server, body, "/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt[1]", r.text[:500]


# -- the limits are configurable ------------------------------------------------------------------

LOWERED = ("--max-schema-depth", "8", "--max-n", "2", "--max-tools", "1",
           "--max-schema-bytes", "4KB", "--compile-deadline", "0.001")  # fmt: skip


@pytest.fixture(scope="module")
def lowered(model_folder, tmp_path_factory):
    """A server with lowered limits: flags, and one environment variable."""
    env = {"CORRAL_MAX_ENUM_VALUES": "2"}
    srv = start_server(model_folder, tmp_path_factory.mktemp("corral-lowered"), LOWERED, env)
    yield srv
    stop_server(srv)


LOWERED_CASES = [
    ("depth", {"response_format": schema_format(nested(4))}, SCHEMA,
     "constraint_too_complex", "max_schema_depth", 8),
    ("n", {"n": 3}, "n", "invalid_value", "max_n", 2),
    ("tools", {"tools": [tool("f"), tool("g")], "tool_choice": "none"}, "tools",
     "invalid_value", "max_tools", 1),
    ("bytes", {"guided_regex": "a" * 5000}, "guided_regex",
     "constraint_too_complex", "max_schema_bytes", 4096),
    ("enum-from-env", {"guided_choice": ["a", "b", "c"]}, "guided_choice",
     "constraint_too_complex", "max_enum_values", 2),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param", "code", "limit", "bound"),
                         [c[1:] for c in LOWERED_CASES], ids=[c[0] for c in LOWERED_CASES])  # fmt: skip
def test_a_lowered_limit_refuses_what_the_default_serves(
    server, lowered, fields, param, code, limit, bound
) -> None:
    refused(lowered, chat(lowered, max_tokens=4) | fields, param, code, limit, bound)
    r, _ = post(server, chat(server, max_tokens=4) | fields)
    assert r.status_code == 200, r.text[:500]


def test_the_compile_deadline_flag_reaches_the_compiler(server, lowered) -> None:
    # no compile of a fresh JSON schema (analysis, grammar, first-mask probe) fits in 1 ms
    fmt = schema_format({"type": "object", "properties": {"deadline": {"type": "boolean"}}})
    r, took = post(lowered, chat(lowered, max_tokens=4, response_format=fmt))
    assert took < ANSWER_S
    assert r.status_code in (400, 503), r.text[:500]  # a refusal now; 503 + Retry-After with G
    err = r.json()["error"]
    assert "deadline" in err["message"] or err["code"] == "compile_timeout", err
    r, _ = post(server, chat(server, max_tokens=4, response_format=fmt))
    assert r.status_code == 200, r.text[:500]
