"""Load with disconnects against a running Corral server: waves of judged requests.

A wave sends `n` concurrent `json_schema` requests (streamed or not); a share of the streaming
clients hang up at a random point (before the first byte, or after a random number of events).
Every request that runs to its end is judged: `finish_reason` "stop" content must validate
against its schema (jsonschema, Draft 2020-12), an error event or a 5xx is a failure, and a
request with no answer within `timeout_s` is stuck. After a wave the server must come back to
its baseline (`wait_for_baseline`): nothing admitted, nothing running, no KV slot held by a
request.

`tests/api/test_api_load.py` runs these waves; the soak (`load_soak.py`, `python -m bench.soak`)
uses `metrics` and `wait_for_baseline`, and the schemas of its `chat.json_schema` requests.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema

SCHEMAS: tuple[dict, ...] = (
    {"type": "object", "additionalProperties": False, "required": ["name", "age"],
     "properties": {"name": {"type": "string", "maxLength": 12},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120}}},
    {"type": "array", "minItems": 1, "maxItems": 4,
     "items": {"enum": ["red", "green", "blue"]}},
    {"type": "object", "additionalProperties": False, "required": ["ok", "tags"],
     "properties": {"ok": {"type": "boolean"},
                    "tags": {"type": "array", "maxItems": 3,
                             "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}}}},
)  # fmt: skip
PROMPTS = ("Invent a person.", "Pick some colours.", "Describe a fruit.", "Say anything.")


@dataclass
class Tally:
    """What happened to the requests of one or more waves."""

    outcomes: Counter = field(default_factory=Counter)  # stop, length, disconnected, ...
    failures: list[str] = field(default_factory=list)  # invalid output, 5xx, error events
    stuck: int = 0
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        self.outcomes.update(other.outcomes)
        self.failures += other.failures
        self.stuck += other.stuck
        self.seconds += other.seconds

    def line(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return f"{counts}; failures {len(self.failures)}; stuck {self.stuck}; {self.seconds:.1f} s"


def body(model: str, k: int, stream: bool, max_tokens: int) -> dict:
    schema = SCHEMAS[k % len(SCHEMAS)]
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}],
        "max_tokens": max_tokens,
        "stream": stream,
        "seed": k,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }


def judge(tally: Tally, req: dict, content: str, finish: str | None) -> None:
    tally.outcomes[finish or "no-finish"] += 1
    if finish == "stop":
        schema = req["response_format"]["json_schema"]["schema"]
        try:
            jsonschema.validate(json.loads(content), schema, jsonschema.Draft202012Validator)
        except (ValueError, jsonschema.ValidationError) as e:
            tally.failures.append(f"invalid output {content!r}: {str(e).splitlines()[0]}")
    elif finish != "length":
        tally.failures.append(f"finish_reason {finish!r} with content {content!r}")


async def plain(client: httpx.AsyncClient, req: dict, tally: Tally) -> None:
    r = await client.post("/v1/chat/completions", json=req)
    if r.status_code != 200:
        tally.failures.append(f"HTTP {r.status_code}: {r.text[:300]}")
        return
    choice = r.json()["choices"][0]
    judge(tally, req, choice["message"]["content"] or "", choice["finish_reason"])


async def streamed(
    client: httpx.AsyncClient, req: dict, tally: Tally, hang_up_after: int | None
) -> None:
    """One streaming request; with `hang_up_after`, close the connection after that many events."""
    content, finish, events = "", None, 0
    async with client.stream("POST", "/v1/chat/completions", json=req) as r:
        if r.status_code != 200:
            tally.failures.append(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            return
        async for line in r.aiter_lines():
            if hang_up_after is not None and events >= hang_up_after:
                tally.outcomes["disconnected"] += 1
                return  # leaving the block closes the connection mid-stream
            if not line.startswith("data: "):
                continue
            events += 1
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                tally.failures.append(f"error event: {chunk['error']}")
                continue
            for c in chunk.get("choices", []):
                content += c["delta"].get("content") or ""
                finish = c.get("finish_reason") or finish
    judge(tally, req, content, finish)


async def wave(
    url: str,
    api_key: str,
    model: str,
    n: int,
    *,
    stream: bool,
    hang_up_share: float = 0.0,
    max_tokens: int = 48,
    timeout_s: float = 300.0,
    seed: int = 0,
) -> Tally:
    """`n` concurrent requests; a `hang_up_share` of the streamed ones disconnect at random."""
    rng = random.Random(seed)
    tally = Tally()
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=n + 4)
    t0 = time.monotonic()
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=timeout_s, limits=limits
    ) as client:

        async def one(k: int) -> None:
            req = body(model, seed * 1000 + k, stream, max_tokens)
            hang_up = stream and rng.random() < hang_up_share
            try:
                if hang_up and rng.random() < 0.25:  # gone before the first byte
                    task = asyncio.ensure_future(streamed(client, req, Tally(), None))
                    await asyncio.sleep(rng.uniform(0.0, 0.5))
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    tally.outcomes["disconnected"] += 1
                elif stream:
                    await streamed(client, req, tally, rng.randint(1, 12) if hang_up else None)
                else:
                    await plain(client, req, tally)
            except httpx.TimeoutException:
                tally.stuck += 1
            except httpx.HTTPError as e:
                tally.failures.append(f"transport error: {e!r}")

        await asyncio.gather(*(one(k) for k in range(n)))
    tally.seconds = time.monotonic() - t0
    return tally


def metrics(url: str) -> dict[str, float]:
    """The samples of /metrics, by name (labelled ones as `name{label="value"}`)."""
    return parse_metrics(httpx.get(url + "/metrics", timeout=60).text)


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def request_held(m: dict[str, float]) -> dict[str, float]:
    """What requests hold now: admitted, running, queued, KV slots outside the prefix cache."""
    return {
        "in_flight": m.get("corral_requests_in_flight", -1),
        "running": m.get("corral_running_requests", -1),
        "queued": m.get("corral_queue_depth", -1),
        "kv_request_tokens": m.get("corral_kv_request_tokens", -1),
        "radix_locked_tokens": m.get("corral_radix_locked_tokens", -1),
    }


def wait_for_baseline(url: str, timeout_s: float = 30.0) -> dict[str, float]:
    """Poll /metrics until nothing is held by a request (or the time is up); the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = request_held(metrics(url))
        if all(v == 0 for v in held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.25)


def rss_bytes(pid: int) -> int:
    """Resident memory of a local process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def round_of_waves(url: str, api_key: str, model: str, n: int, seed: int, max_tokens: int) -> Tally:
    """The test's unit: `n` streamed requests (a third hang up), then `n` plain ones."""
    tally = Tally()
    tally.add(asyncio.run(wave(url, api_key, model, n, stream=True, hang_up_share=1 / 3,
                               max_tokens=max_tokens, seed=seed)))  # fmt: skip
    tally.add(asyncio.run(wave(url, api_key, model, n, stream=False, max_tokens=max_tokens,
                               seed=seed + 1)))  # fmt: skip
    return tally
