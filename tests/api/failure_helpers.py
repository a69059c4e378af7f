"""Helpers for the failure-path tests against a real `corral serve` (HTTP, SSE, metrics)."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx

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
