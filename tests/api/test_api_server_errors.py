"""End to end: every client mistake is a 4xx in OpenAI's error shape (never a 500), the queue
limit answers 429 with Retry-After, and a client that disconnects frees what it held."""

from __future__ import annotations

import re
import threading
import time

import httpx
import openai
import pytest


def post(
    server, body: dict, key: str | None = "default", path: str = "/v1/chat/completions"
) -> httpx.Response:
    headers = (
        {}
        if key is None
        else {"Authorization": f"Bearer {server.api_key if key == 'default' else key}"}
    )
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120)


def chat(server, **kw) -> dict:
    return {
        "model": server.model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    } | kw


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) >= {"message", "type", "param", "code"}
    return err


def schema_format(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_schema_is_400_with_pointer(server, stream) -> None:
    bad = {"type": "object", "properties": {"x": {"type": "strin"}}}
    err = error_of(
        post(server, chat(server, stream=stream, response_format=schema_format(bad))), 400
    )
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_constraint"
    assert err["param"] == "response_format.json_schema.schema"
    assert (err["pointer"], err["keyword"]) == ("/properties/x/type", "type")
    assert "/properties/x/type" in err["message"]


def test_unenforceable_keyword_in_strict_mode_is_400(server) -> None:
    # distinct numbers below a bound: the matcher could be left with every one held
    tags = {"type": "array", "items": {"type": "integer", "maximum": 1000}, "uniqueItems": True}
    schema = {"type": "object", "properties": {"tags": tags}}
    err = error_of(post(server, chat(server, response_format=schema_format(schema))), 400)
    assert (err["pointer"], err["keyword"]) == ("/properties/tags/uniqueItems", "uniqueItems")


def test_unenforceable_keyword_in_a_strict_tool_is_400(server) -> None:
    params = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params, "strict": True}}]
    err = error_of(post(server, chat(server, tools=tools, tool_choice="required")), 400)
    assert err["param"] == "tools[0].function.parameters"
    assert (err["pointer"], err["keyword"]) == ("/properties/ids/uniqueItems", "uniqueItems")


@pytest.mark.parametrize(
    ("fmt", "param"),
    [({"type": "regex", "regex": "([a-z]"}, "response_format.regex"),
     ({"type": "grammar", "grammar": "root ::= ( unclosed"}, "response_format.grammar"),
     ({"type": "grammar", "syntax": "lark", "grammar": "start: undefined_rule"}, "response_format.grammar"),
     ({"type": "choice", "choice": []}, "response_format.choice")],
)  # fmt: skip
def test_invalid_regex_or_grammar_is_400(server, fmt, param) -> None:
    err = error_of(post(server, chat(server, response_format=fmt)), 400)
    assert err["param"] == param


@pytest.mark.parametrize(
    ("overrides", "param"),
    [({"temperature": 5}, "temperature"), ({"n": 0}, "n"), ({"messages": []}, "messages"),
     ({"max_tokens": 0}, "max_tokens"), ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
     ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
     ({"tool_choice": "sometimes"}, "tool_choice"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop")],
)  # fmt: skip
def test_bad_parameters_are_400_not_422(server, overrides, param) -> None:
    err = error_of(post(server, chat(server, **overrides)), 400)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param)


def test_body_that_is_not_json_is_400(server) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"})  # fmt: skip
    error_of(r, 400)


def test_prompt_longer_than_the_context_is_400(server) -> None:
    long = "word " * 9000  # SmolLM2's context is 8192 tokens
    err = error_of(post(server, chat(server, messages=[{"role": "user", "content": long}])), 400)
    assert err["code"] == "context_length_exceeded"
    err = error_of(post(server, chat(server, max_tokens=100_000)), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_missing_or_wrong_key_is_401(server, key) -> None:
    err = error_of(post(server, chat(server), key=key), 401)
    assert err["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_unknown_model_is_404(server) -> None:
    err = error_of(post(server, chat(server, model="gpt-17")), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(
            model="gpt-17", messages=[{"role": "user", "content": "x"}]
        )


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_queue_full_is_429_and_disconnects_free_everything(server) -> None:
    """The server admits 2 running + 2 queued; a 5th request is refused with Retry-After.
    Closing the four open streams aborts their engine requests and frees their KV."""
    # the regex keeps every stream generating until max_tokens: none can end early
    forever = {"type": "regex", "regex": "[a-z]+( [a-z]+){3000}"}
    long = chat(server, max_tokens=2000, stream=True, response_format=forever)
    headers = {"Authorization": f"Bearer {server.api_key}"}
    clients = [httpx.Client(base_url=server.url, headers=headers, timeout=120) for _ in range(4)]
    streams, lines = [], []
    try:
        for c in clients:
            s = c.stream("POST", "/v1/chat/completions", json=long)
            r = s.__enter__()
            streams.append(s)
            assert r.status_code == 200
            # keep the line iterator alive: dropping it would close the connection
            lines.append(r.iter_lines())
            assert next(lines[-1]).startswith("data: ")  # admitted and streaming
        err = error_of(post(server, chat(server)), 429)
        assert int(post(server, chat(server)).headers["Retry-After"]) >= 1
        assert err["code"] == "rate_limit_exceeded"
        assert metric(server, "corral_requests_in_flight") == 4
    finally:
        for s in streams:
            s.__exit__(None, None, None)
        for c in clients:
            c.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and metric(server, "corral_requests_in_flight"):
        time.sleep(0.2)
    assert metric(server, "corral_requests_in_flight") == 0
    assert_engine_idle(server)


def assert_engine_idle(server) -> None:
    """Nothing left running in the engine (its figures are refreshed by a step: run one)."""
    assert post(server, chat(server, max_tokens=1)).status_code == 200
    assert metric(server, "corral_running_requests") == 0
    assert metric(server, "corral_queue_depth") == 0


def test_disconnect_during_a_non_streaming_request_aborts_it(server) -> None:
    forever = {"type": "regex", "regex": "[a-z]+( [a-z]+){3000}"}
    body = chat(server, max_tokens=2000, response_format=forever)
    done = threading.Event()

    def call() -> None:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        try:  # the client gives up after 1.5 s, long before 2000 tokens are generated
            httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=1.5)
        except httpx.TimeoutException:
            pass
        done.set()

    threading.Thread(target=call).start()
    assert done.wait(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and metric(server, "corral_requests_in_flight"):
        time.sleep(0.2)
    assert metric(server, "corral_requests_in_flight") == 0
    assert_engine_idle(server)


def test_metrics_expose_the_documented_families(server) -> None:
    post(server, chat(server))
    text = httpx.get(server.url + "/metrics").text
    for name in ("corral_requests_total", "corral_prompt_tokens_total", "corral_completion_tokens_total",
                 "corral_time_to_first_token_seconds_bucket", "corral_inter_token_latency_seconds_bucket",
                 "corral_queue_depth", "corral_kv_cache_usage_ratio", "corral_radix_cache_hit_tokens_total",
                 'corral_constraint_compiles_total{source="memory"}', 'corral_constraint_compiles_total{source="compiled"}',
                 'corral_constraint_compiles_total{source="disk"}', "corral_constraint_compile_seconds_total"):  # fmt: skip
        assert name in text, name
    assert metric(server, "corral_prompt_tokens_total") > 0


def test_occupancy_gauges_follow_what_the_server_holds(server) -> None:
    """The soak's gauges: a new schema adds a compiled entry (and its bytes) to the memory tier,
    a finished request leaves its tokens in the radix cache, which never exceeds the pool."""
    entries, held = metric(server, "corral_constraint_cache_entries"), _tier(server, "memory")
    schema = {"type": "object", "properties": {f"g{time.time_ns()}": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "g", "schema": schema}}
    assert post(server, chat(server, response_format=fmt, max_tokens=8)).status_code == 200
    assert metric(server, "corral_constraint_cache_entries") == entries + 1
    assert _tier(server, "memory") > held
    assert _tier(server, "disk") >= 0
    cached = metric(server, "corral_radix_cached_tokens")
    assert 0 < cached <= metric(server, "corral_kv_capacity_tokens")


def _tier(server, tier: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf'^corral_constraint_cache_bytes{{tier="{tier}"}} ([0-9.e+-]+)$', text, re.M)
    assert m, text
    return float(m.group(1))
