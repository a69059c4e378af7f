"""End to end: the failure paths of a real `corral serve` — failures never pass as success, the
server survives faults and floods, and says the truth about itself.

The documented mapping (README "Failure semantics"): a generation that cannot finish is a 5xx
in OpenAI's error shape, or, once a stream has started, an error event then `[DONE]`; counted
in /metrics. Faults are injected through real code paths: `CORRAL_FAULTS` (an exception inside
an engine step) and `CORRAL_LLG_LIMITS` (llguidance limits lowered so that a real matcher enters
its error state mid-request), each on a server of its own.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import jsonschema
import pytest
from api_server import start_server, stop_server

# Keeps a stream generating until max_tokens: neither EOS nor the grammar can end it early.
FOREVER = {"type": "regex", "regex": "[a-z]+( [a-z]+){3000}"}
# With llguidance's max_items_in_row lowered to 1000 this compiles: the compile-time probe walks
# the first 9 positions, and the string "a" (at least 12 characters, the model's choice) keeps
# it from reaching "b". The Earley row of the inner object (300 optional properties, ~1200
# items) trips the limit once the model has written `{"a":"…","b`: mid-request. Rebuilding the
# matcher and replaying the tokens cannot help (the limit trips again at the same token).
FRAGILE_LIMITS = {"max_items_in_row": 1000}
FRAGILE = {
    "type": "object",
    "properties": {
        "a": {"type": "string", "minLength": 12, "maxLength": 20},
        "b": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}},
    },
    "required": ["a", "b"],
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


# ---- helpers --------------------------------------------------------------------------------


def headers(server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.api_key}"}


def post(server, body: dict | bytes, path: str = "/v1/chat/completions", timeout: float = 120):
    if isinstance(body, bytes):
        h = headers(server) | {"Content-Type": "application/json"}
        return httpx.post(server.url + path, content=body, headers=h, timeout=timeout)
    return httpx.post(server.url + path, json=body, headers=headers(server), timeout=timeout)


def chat(server, **kw) -> dict:
    base = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return base | kw


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


def strict_json(text: str):
    """JSON as the standard defines it: NaN and ±Infinity are not numbers JSON has."""

    def refuse(name: str):
        raise AssertionError(f"{name} in a response body: {text[:300]}")

    return json.loads(text, parse_constant=refuse)


def error_of(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text[:2000]
    err = strict_json(r.text)["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def sse(server, body: dict, path: str = "/v1/chat/completions") -> tuple[int, list[str]]:
    """A streamed request's status and its `data:` payloads, in order."""
    with httpx.stream(
        "POST", server.url + path, json=body, headers=headers(server), timeout=120
    ) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [r.text]
        return 200, [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def metrics_text(server) -> str:
    return httpx.get(server.url + "/metrics", timeout=30).text


def metric(server, name: str, labels: str = "") -> float:
    """A sample of /metrics; `labels` (e.g. 'code="constraint_failed"') must all be present."""
    for line in metrics_text(server).splitlines():
        m = re.match(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", line)
        if m and all(part in (m.group(1) or "") for part in filter(None, labels.split(","))):
            return float(m.group(2))
    raise AssertionError(f"{name}{{{labels}}} not in /metrics")


def wait_for(cond, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval_s)
    return cond()


class Pinger:
    """Pings /health in the background; `worst` is the slowest answer seen (a stalled loop)."""

    def __init__(self, server) -> None:
        self.url, self.worst, self.count = server.url + "/health", 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as c:
            while not self._stop.is_set():
                t0 = time.monotonic()
                c.get(self.url)
                self.worst = max(self.worst, time.monotonic() - t0)
                self.count += 1
                time.sleep(0.05)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


# ---- logprobs -------------------------------------------------------------------------------


def _check_entry(entry: dict) -> None:
    assert isinstance(entry["logprob"], float | int) and math.isfinite(entry["logprob"]), entry
    for alt in entry["top_logprobs"]:
        assert isinstance(alt["logprob"], float | int) and math.isfinite(alt["logprob"]), alt
    assert len(entry["top_logprobs"]) <= 5


@pytest.mark.parametrize("top", [2, 5])
def test_logprobs_under_a_schema_are_finite_and_agree_streamed_or_not(server, top) -> None:
    """Masked alternatives have log probability -inf, which JSON cannot carry: they are left out
    of top_logprobs (a 500 before; streamed, `"logprob": null`)."""
    body = chat(server, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=12,
                temperature=0, seed=7, logprobs=True, top_logprobs=top,
                response_format=schema_format(PERSON))  # fmt: skip
    r = post(server, body)
    assert r.status_code == 200, r.text[:2000]
    whole = strict_json(r.text)["choices"][0]["logprobs"]["content"]
    for entry in whole:
        _check_entry(entry)
    status, events = sse(server, body | {"stream": True})
    assert status == 200 and events[-1] == "[DONE]"
    streamed = []
    for e in events[:-1]:
        for choice in strict_json(e)["choices"]:
            streamed += (choice.get("logprobs") or {}).get("content") or []
    for entry in streamed:
        _check_entry(entry)
    assert [e["token"] for e in streamed] == [e["token"] for e in whole]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in whole])


def test_completion_logprobs_under_a_constraint_are_finite(server) -> None:
    body = {"model": server.model, "prompt": "Year:", "max_tokens": 6, "logprobs": 5,
            "temperature": 0, "response_format": {"type": "regex", "regex": "(19|20)[0-9]{2}"}}  # fmt: skip
    r = post(server, body, "/v1/completions")
    assert r.status_code == 200, r.text[:2000]
    lp = strict_json(r.text)["choices"][0]["logprobs"]
    assert lp["tokens"] and all(math.isfinite(v) for v in lp["token_logprobs"])
    assert all(math.isfinite(v) for top in lp["top_logprobs"] for v in top.values())


# ---- client text that no tokenizer takes, bodies too big or too deep ------------------------


def test_a_lone_surrogate_in_client_text_is_a_400(server) -> None:
    """`"\\ud800"` is valid JSON but not valid Unicode: the tokenizer raised TypeError (a 500)."""
    text = json.dumps(chat(server, messages=[{"role": "user", "content": "hi LONE there"}]))
    err = error_of(post(server, text.replace("LONE", "\\ud800").encode()), 400)
    assert err["param"] and err["param"].startswith("messages")
    text = json.dumps({"model": server.model, "max_tokens": 3, "prompt": "a LONE b"})
    err = error_of(post(server, text.replace("LONE", "\\udfff").encode(), "/v1/completions"), 400)
    assert err["param"] == "prompt"


@pytest.mark.parametrize("megabytes", [10, 100])
def test_a_body_over_the_limit_is_413_at_once(server, megabytes) -> None:
    """The default limit is 8 MB; bigger bodies are refused before they are parsed, and the
    server stays responsive meanwhile."""
    body = b'{"model": "m", "prompt": "' + b"a" * (megabytes << 20) + b'"}'
    with Pinger(server) as pinger:
        t0 = time.monotonic()
        r = post(server, body, "/v1/completions", timeout=60)
        took = time.monotonic() - t0
    err = error_of(r, 413, "request_too_large")
    assert "max-body-bytes" in err["message"]
    assert took < 5, f"a {megabytes} MB body took {took:.1f}s to refuse"
    assert pinger.worst < 2, f"/health took {pinger.worst:.1f}s meanwhile"


def test_a_chunked_body_over_the_limit_is_413(server) -> None:
    """No Content-Length: the body is counted as it arrives and refused past the limit."""

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "m", "prompt": "'
        for _ in range(160):  # 10 MB
            yield b"a" * (1 << 16)
        yield b'"}'

    h = headers(server) | {"Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers=h, timeout=60)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    error_of(r, 413, "request_too_large")


def test_json_nested_past_the_parser_is_400(server) -> None:
    deep = ("[" * 100_000) + ("]" * 100_000)
    raw = json.dumps({"model": server.model, "prompt": "hi", "x": 0}).replace("0}", deep + "}")
    error_of(post(server, raw.encode(), "/v1/completions"), 400, "invalid_value")


# ---- admission and gauges -------------------------------------------------------------------


def _hold_all_slots(server) -> tuple[list, list]:
    """Four open streams: the session server admits 2 running + 2 queued."""
    long = chat(server, max_tokens=2000, stream=True, response_format=FOREVER)
    clients = [httpx.Client(base_url=server.url, headers=headers(server), timeout=120)
               for _ in range(4)]  # fmt: skip
    streams = []
    for c in clients:
        s = c.stream("POST", "/v1/chat/completions", json=long)
        r = s.__enter__()
        streams.append((s, r.iter_lines()))
        assert r.status_code == 200
        assert next(streams[-1][1]).startswith("data: ")
    return clients, streams


def _release(clients, streams) -> None:
    for s, _ in streams:
        s.__exit__(None, None, None)
    for c in clients:
        c.close()


def test_a_full_server_answers_429_before_compiling(server) -> None:
    """A flood of distinct schemas must be refused by admission, not compiled first."""
    clients, streams = _hold_all_slots(server)
    try:
        compiled = metric(server, "corral_constraint_compiles_total", 'source="compiled"')
        fresh = {"type": "object", "properties": {f"k{uuid.uuid4().hex[:8]}": {"type": "integer"}}}
        r = post(server, chat(server, response_format=schema_format(fresh)))
        err = error_of(r, 429, "rate_limit_exceeded")
        assert int(r.headers["Retry-After"]) >= 1, err
        after = metric(server, "corral_constraint_compiles_total", 'source="compiled"')
        assert after == compiled, "the constraint was compiled for a request that got a 429"
    finally:
        _release(clients, streams)
    assert wait_for(lambda: metric(server, "corral_requests_in_flight") == 0, 30)


def test_gauges_are_fresh_after_a_disconnect(server) -> None:
    """After a client leaves, /metrics shows its sequence gone without another request."""
    clients, streams = [], []
    try:
        body = chat(server, max_tokens=2000, stream=True, response_format=FOREVER)
        c = httpx.Client(base_url=server.url, headers=headers(server), timeout=120)
        s = c.stream("POST", "/v1/chat/completions", json=body)
        lines = s.__enter__().iter_lines()
        clients, streams = [c], [(s, lines)]
        for _ in range(4):  # decoding now
            next(lines)
        assert wait_for(lambda: metric(server, "corral_running_requests") >= 1, 10)
    finally:
        _release(clients, streams)
    assert wait_for(lambda: metric(server, "corral_running_requests") == 0, 10), (
        "corral_running_requests still counts a sequence whose client left"
    )
    assert metric(server, "corral_requests_in_flight") == 0


# ---- servers with fault knobs ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fragile(model_folder, tmp_path_factory):
    """A server whose llguidance limits are lowered (CORRAL_LLG_LIMITS) and whose body limit is
    raised to 64 MB (so a 10 MB prompt reaches the handler)."""
    srv = start_server(
        model_folder,
        tmp_path_factory.mktemp("corral-fragile"),
        ("--max-body-bytes", "64MB", "--max-concurrent", "4"),
        env={"CORRAL_LLG_LIMITS": json.dumps(FRAGILE_LIMITS)},
    )
    yield srv
    stop_server(srv)


def _person_prompt(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "Fill in the object."}], "max_tokens": 40,
            "temperature": 0, "response_format": schema_format(FRAGILE)} | kw  # fmt: skip


def test_a_matcher_in_error_state_is_a_500_never_a_truncated_200(fragile) -> None:
    before = metric(fragile, "corral_generation_failures_total", 'code="constraint_failed"')
    r = post(fragile, {"model": fragile.model} | _person_prompt())
    if r.status_code == 200:
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":  # a "stop" that does not validate is the lie
            jsonschema.validate(json.loads(choice["message"]["content"]), FRAGILE)
        pytest.fail(f"the lowered limit did not trip mid-request: {choice}")
    err = error_of(r, 500, "constraint_failed")
    assert err["type"] == "server_error"
    status, events = sse(fragile, {"model": fragile.model} | _person_prompt(stream=True))
    assert status == 200 and events[-1] == "[DONE]", events[-3:]
    error = strict_json(events[-2])["error"]
    assert error["code"] == "constraint_failed" and error["type"] == "server_error"
    for e in events[:-2]:
        for choice in strict_json(e).get("choices", []):
            assert choice.get("finish_reason") is None, "a failed choice was reported finished"
    after = metric(fragile, "corral_generation_failures_total", 'code="constraint_failed"')
    assert after == before + 2
    assert metric(fragile, "corral_generations_total", 'outcome="500"') >= 2
    # the server is fine afterwards: other requests are served
    assert post(fragile, chat(fragile)).status_code == 200
    assert httpx.get(fragile.url + "/health").status_code == 200


def test_a_10mb_prompt_is_refused_at_once_and_stalls_nobody(fragile) -> None:
    """A prompt too long for the context gets its 400 without being tokenized (it took 18 s on
    the event loop); /health and a small request are answered meanwhile."""
    huge = "word " * (2 << 20)  # 10 MB
    results: dict[str, tuple[int, str, float]] = {}

    def send(kind: str) -> None:
        t0 = time.monotonic()
        if kind == "chat":
            r = post(fragile, chat(fragile, messages=[{"role": "user", "content": huge}]))
        else:
            body = {"model": fragile.model, "prompt": huge, "max_tokens": 3}
            r = post(fragile, body, "/v1/completions")
        code = r.json()["error"]["code"] if r.status_code != 200 else ""
        results[kind] = (r.status_code, code, time.monotonic() - t0)

    threads = [threading.Thread(target=send, args=(k,)) for k in ("chat", "completions")]
    with Pinger(fragile) as pinger:
        for t in threads:
            t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        small = post(fragile, {"model": fragile.model, "prompt": "hi", "max_tokens": 2},
                     "/v1/completions")  # fmt: skip
        small_s = time.monotonic() - t0
        for t in threads:
            t.join(timeout=120)
    for kind, (status, code, took) in results.items():
        assert (status, code) == (400, "context_length_exceeded"), kind
        assert took < 5, f"{kind}: the 400 took {took:.1f}s"
    assert small.status_code == 200 and small_s < 5, f"a small request took {small_s:.1f}s"
    assert pinger.count and pinger.worst < 2, f"/health took {pinger.worst:.1f}s meanwhile"


@pytest.fixture(scope="module")
def faulty(model_folder, tmp_path_factory):
    """A server with armed engine faults (CORRAL_FAULTS; each fires once). A failed step
    rebuilds the engine, whose batch count starts again at 1: the step fails in the 8th batch
    of the first engine and in the 30th of the second; a sequence fails in the 40th of the
    third."""
    srv = start_server(
        model_folder,
        tmp_path_factory.mktemp("corral-faulty"),
        env={"CORRAL_FAULTS": "step@8,step@30,seq@40"},
    )
    yield srv
    stop_server(srv)


def _healthy_again(server) -> None:
    assert wait_for(lambda: httpx.get(server.url + "/health").status_code == 200, 60)
    body = httpx.get(server.url + "/health").json()
    assert body["status"] == "ok"


def test_engine_faults_fail_the_affected_requests_and_the_server_recovers(faulty) -> None:
    """One scenario, in order (the faults count engine batches): a step fails mid-stream, then
    inside a non-streamed request; then one sequence of an n=2 request fails. Each time the
    request in flight gets the documented error, /health reports the engine ready again, and
    later requests are served."""
    long = chat(faulty, max_tokens=80, response_format=FOREVER)
    # engine 1, batch 8: the step fails while streaming
    status, events = sse(faulty, long | {"stream": True})
    assert status == 200 and events[-1] == "[DONE]", events[-3:]
    error = strict_json(events[-2])["error"]
    assert error["code"] == "engine_restarted" and error["type"] == "server_error"
    _healthy_again(faulty)
    # engine 2, batch 30: the step fails inside this one request
    r = post(faulty, long)
    err = error_of(r, 503, "engine_restarted")
    assert int(r.headers["Retry-After"]) >= 1, err
    _healthy_again(faulty)
    # engine 3, batches 1-9: served
    r = post(faulty, chat(faulty, max_tokens=8, response_format=FOREVER))
    assert r.status_code == 200, r.text
    # engine 3, batch 40: one choice of two fails, so the request fails; the engine goes on
    err = error_of(post(faulty, long | {"n": 2}), 500, "sequence_failed")
    assert err["type"] == "server_error"
    assert httpx.get(faulty.url + "/health").status_code == 200
    assert post(faulty, chat(faulty, max_tokens=8)).status_code == 200
    assert metric(faulty, "corral_generation_failures_total", 'code="engine_restarted"') == 2
    assert metric(faulty, "corral_generation_failures_total", 'code="sequence_failed"') == 1
    assert metric(faulty, "corral_generations_total", 'outcome="503"') == 2
    assert metric(faulty, "corral_generations_total", 'outcome="500"') == 1
