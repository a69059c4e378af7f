"""End to end: the failure paths of a real `corral serve` — failures never pass as success, the
server survives faults and floods, and says the truth about itself.

The documented mapping (docs/serving.md, "Failure semantics"): a generation that cannot finish is a 5xx
in OpenAI's error shape, or, once a stream has started, an error event then `[DONE]`; counted
in /metrics. Faults are injected through real code paths: `CORRAL_FAULTS` (an exception inside
an engine step) and `CORRAL_LLG_LIMITS` (llguidance limits lowered so that a real matcher enters
its error state mid-request), each on a server of its own.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from failure_helpers import (
    FOREVER,
    PERSON,
    Pinger,
    chat,
    error_of,
    headers,
    metric,
    post,
    schema_format,
    sse,
    strict_json,
    wait_for,
)


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
