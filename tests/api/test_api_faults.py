"""End to end: faults injected through real code on servers of their own — a matcher driven
into llguidance's error state mid-request (`CORRAL_LLG_LIMITS`) and exceptions inside engine steps
(`CORRAL_FAULTS`): the affected request gets the documented error, the server recovers.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import jsonschema
import pytest
from api_server import start_server, stop_server
from failure_helpers import (
    FOREVER,
    FRAGILE,
    FRAGILE_LIMITS,
    Pinger,
    chat,
    error_of,
    metric,
    post,
    schema_format,
    sse,
    strict_json,
    wait_for,
)


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
