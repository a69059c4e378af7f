"""`corral fleet` with 2 replicas of the default model on local Ray, a real redis-server as the
shared compile-cache tier, driven with the `openai` client: outputs validate, a repeated long
prefix stays on its replica (and hits its prefix cache), a schema compiled on one replica is a
Redis hit on the other, and streams, errors and disconnects behave as with one `corral serve`."""

from __future__ import annotations

import json
import os

import httpx
import jsonschema
import pytest
from fleet_server import REPLICA_HEADER, start_fleet, stop_fleet_process
from redis_server import RedisServer

from corral.base.paths import constraints_root
from corral.schema_cache.redis_store import PREFIX

MAX_BODY = 64 << 10
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
# Keeps a stream generating until max_tokens: neither EOS nor the grammar can end it early.
FOREVER = {"type": "regex", "regex": "[a-z]+( [a-z]+){3000}"}


def schema_format(schema: dict, name: str = "x") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def fleet(model_folder, tmp_path_factory):
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    key = tmp_path_factory.mktemp("secrets") / "fleet.key"  # every replica seals under it
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    args = ("--cpus", "2", "--cache-url", redis.url, "--cache-key-file", str(key),
            "--max-concurrent", "2",
            "--queue-limit", "2", "--memory", "256MB", "--compile-workers", "1",
            "--max-body-bytes", str(MAX_BODY))  # fmt: skip
    try:
        fleet = start_fleet(model_folder, tmp_path_factory.mktemp("fleet-cache"), 2, args)
        try:
            yield fleet, redis
        finally:
            stop_fleet_process(fleet.proc)
    finally:
        redis.stop()


def ask(fleet, replica: str | None = None, **kw):
    """A chat completion through the fleet: (the parsed completion, the replica that answered)."""
    body = {"model": fleet.model, "max_tokens": 24, "temperature": 0} | kw
    body.setdefault("messages", [{"role": "user", "content": "Describe a person in JSON."}])
    headers = {REPLICA_HEADER: replica} if replica else None
    raw = fleet.client().chat.completions.with_raw_response.create(**body, extra_headers=headers)
    return raw.parse(), raw.headers[REPLICA_HEADER]


def test_constrained_outputs_validate_streamed_or_not(fleet) -> None:
    fleet, _ = fleet
    done, _ = ask(fleet, response_format=schema_format(PERSON), max_tokens=48)
    assert done.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(done.choices[0].message.content), PERSON)

    stream = fleet.client().chat.completions.create(
        model=fleet.model,
        messages=[{"role": "user", "content": "Another person, in JSON."}],
        response_format=schema_format(PERSON),
        max_tokens=48,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_a_repeated_long_prefix_stays_on_its_replica_and_hits_its_prefix_cache(fleet) -> None:
    fleet, _ = fleet
    system = "You are a meticulous archivist. Answer briefly, in plain words. " * 30
    answers = [
        ask(fleet, max_tokens=2, messages=[{"role": "system", "content": system},
                                           {"role": "user", "content": f"Question {i}: why?"}])
        for i in range(4)
    ]  # fmt: skip
    replicas = {replica for _, replica in answers}
    assert len(replicas) == 1, f"one prefix went to {replicas}"
    prefix_tokens = answers[0][0].usage.prompt_tokens - 16
    for done, _ in answers[1:]:
        cached = done.usage.prompt_tokens_details.cached_tokens
        assert cached >= prefix_tokens, (cached, prefix_tokens)


def test_a_schema_compiled_on_one_replica_reaches_the_other_through_redis(fleet) -> None:
    """Not compiled again on the second replica: it came from Redis, either loaded ahead by the
    prefetch (the first replica announced it) or fetched when the request asked."""
    fleet, redis = fleet
    first, second = fleet.replica_ids(2)
    schema = {**PERSON, "properties": {**PERSON["properties"], "city": {"enum": ["Oslo", "Rome"]}}}
    schema["required"] = [*PERSON["required"], "city"]
    fmt = schema_format(schema, "traveller")
    compiled = 'source="compiled"'

    def from_redis(r: str) -> float:
        return fleet.metric(r, "corral_constraint_compiles_total", 'source="redis"') + fleet.metric(
            r, "corral_constraint_cache_prefetched_total"
        )

    before = {
        r: (fleet.metric(r, "corral_constraint_compiles_total", compiled), from_redis(r))
        for r in (first, second)
    }

    done, answered = ask(fleet, first, response_format=fmt, max_tokens=64)
    assert answered == first
    jsonschema.validate(json.loads(done.choices[0].message.content), schema)
    assert fleet.metric(first, "corral_constraint_compiles_total", compiled) == before[first][0] + 1
    with redis.client() as client:  # published behind the answer
        assert _wait(lambda: [k for k in client.keys(PREFIX + "*") if not k.endswith(b":lock")])
    # The replicas share this machine's disk cache; a second machine would not have the file.
    for entry in constraints_root(fleet.cache).rglob("*.cc"):
        entry.unlink()

    done, answered = ask(fleet, second, response_format=fmt, max_tokens=64)
    assert answered == second
    jsonschema.validate(json.loads(done.choices[0].message.content), schema)
    compiles, loaded = before[second]
    assert fleet.metric(second, "corral_constraint_compiles_total", compiled) == compiles
    assert from_redis(second) == loaded + 1


def test_errors_are_the_single_servers(fleet) -> None:
    fleet, _ = fleet
    headers = {"Authorization": f"Bearer {fleet.api_key}"}
    bad = {"model": fleet.model, "messages": [{"role": "user", "content": "hi"}],
           "response_format": schema_format({"properties": {"x": {"type": "strin"}}})}  # fmt: skip
    for stream in (False, True):
        r = httpx.post(fleet.url + "/v1/chat/completions", json=bad | {"stream": stream},
                       headers=headers, timeout=60)  # fmt: skip
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["code"], err["pointer"]) == ("invalid_constraint", "/properties/x/type")
    r = httpx.post(fleet.url + "/v1/chat/completions", json=bad, timeout=60)
    assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
    r = httpx.post(fleet.url + "/v1/chat/completions", content=b"x" * (MAX_BODY + 1),
                   headers=headers | {"Content-Type": "application/json"}, timeout=60)  # fmt: skip
    assert (r.status_code, r.json()["error"]["code"]) == (413, "request_too_large")


def test_a_client_that_disconnects_frees_its_sequence(fleet) -> None:
    fleet, _ = fleet
    replica = fleet.replica_ids(2)[0]
    body = {"model": fleet.model, "messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": 2000, "stream": True, "response_format": FOREVER}  # fmt: skip
    headers = {"Authorization": f"Bearer {fleet.api_key}", REPLICA_HEADER: replica}
    with httpx.stream("POST", fleet.url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=60) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers[REPLICA_HEADER] == replica
        lines = r.iter_lines()
        for _ in range(4):  # decoding now
            next(lines)
        assert fleet.metric(replica, "corral_running_requests") >= 1
    assert _wait(lambda: fleet.metric(replica, "corral_running_requests") == 0), (
        "the replica still decodes for a client that left"
    )
    assert fleet.metric(replica, "corral_requests_in_flight") == 0


def _wait(cond, timeout_s: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return bool(cond())
