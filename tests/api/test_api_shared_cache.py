"""`corral serve --cache-url` against a real redis-server: compiled constraints reach Redis;
with Redis stopped mid-run requests are still served, `/health` answers 200 "degraded" and
`/metrics` says so, and both are back to normal once Redis is (the service's tests check that
it is used again); a schema one server compiled is in a second server's memory before it is
asked for it (prefetch), counted in `/metrics`."""

from __future__ import annotations

import json
import os

import httpx
import jsonschema
import pytest
from api_server import start_server, stop_server
from failure_helpers import wait_for
from redis_server import RedisServer

from corral.api.config import ServerConfig
from corral.schema_cache.redis_store import ANNOUNCE, PREFIX


def test_the_cache_url_must_name_a_redis(tmp_path) -> None:
    key = key_file(tmp_path)
    url = "redis://cache:6379/0"
    assert ServerConfig(cache_url=url, cache_key_file=key).cache_url == url
    assert ServerConfig(cache_url="").cache_url is None
    with pytest.raises(ValueError, match="redis://"):
        ServerConfig(cache_url="http://cache:6379", cache_key_file=key)
    with pytest.raises(ValueError, match="--cache-url needs --cache-key-file"):
        ServerConfig(cache_url=url)


def key_file(folder) -> str:
    """The key file every server of a test shares (mode 0600)."""
    path = folder / "cache.key"
    if not path.exists():
        path.write_bytes(os.urandom(32).hex().encode())
        path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def fleet_of_one(model_folder, tmp_path_factory):
    """A Redis and one `corral serve` that shares its compiled constraints there."""
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    key_file(redis.folder)
    server = start_server(model_folder, tmp_path_factory.mktemp("corral-cache"), args_for(redis))
    yield server, redis
    stop_server(server)
    redis.stop()


def args_for(redis: RedisServer) -> tuple[str, ...]:
    return ("--cache-url", redis.url, "--cache-key-file", key_file(redis.folder),
            "--max-concurrent", "2", "--memory", "256MB")  # fmt: skip


def schema(key: str) -> dict:
    return {
        "type": "object",
        "properties": {key: {"type": "boolean"}},
        "required": [key],
        "additionalProperties": False,
    }


def served(server, key: str) -> None:
    """A constrained chat completion, answered 200 with an instance of ``schema(key)``."""
    response = server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": f"Is the sky blue? Answer in JSON with `{key}`."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": key, "schema": schema(key)},
        },
        max_tokens=24,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), schema(key))


def redis_state(server) -> str:
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    [on] = [
        line.split('state="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("corral_constraint_cache_redis_state{") and line.endswith(" 1.0")
    ]
    return on


def test_redis_stopped_mid_run_requests_are_served_and_health_says_degraded(fleet_of_one):
    server, redis = fleet_of_one
    health = httpx.get(server.url + "/health", timeout=10)
    assert (health.status_code, health.json()["status"]) == (200, "ok")
    assert redis_state(server) == "ok"
    served(server, "first")
    with redis.client() as client:
        assert wait_for(lambda: client.keys(PREFIX + "*"), 10)  # published behind the answer

    redis.stop()
    served(server, "first")  # from memory
    served(server, "second")  # compiled here
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "degraded" and redis.url in body["degraded"]["shared_cache"]
    assert redis_state(server) == "down"

    redis.start()  # back, empty; the server finds it within its retry interval (5 s)
    assert wait_for(lambda: httpx.get(server.url + "/health").json()["status"] == "ok", 20)
    assert redis_state(server) == "ok"


def metric(server, line_start: str) -> float:
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    [value] = [line.split(" ")[-1] for line in metrics.splitlines() if line.startswith(line_start)]
    return float(value)


def test_a_schema_one_server_compiled_is_in_the_others_memory_before_it_is_asked(
    fleet_of_one, model_folder, tmp_path_factory
):
    server, redis = fleet_of_one
    other = start_server(model_folder, tmp_path_factory.mktemp("corral-cache"), args_for(redis))
    try:
        with redis.client() as client:  # both listen (the first one again, after an outage)
            assert wait_for(lambda: client.pubsub_numsub(ANNOUNCE)[0][1] == 2, 20)
        served(server, "prefetched")
        prefetched = "corral_constraint_cache_prefetched_total "
        assert wait_for(lambda: metric(other, prefetched) == 1, 30)
        served(other, "prefetched")
        assert metric(other, 'corral_constraint_compiles_total{source="compiled"}') == 0
        assert metric(other, 'corral_constraint_compiles_total{source="redis"}') == 0
        assert metric(other, 'corral_constraint_compiles_total{source="memory"}') == 1
        # nor derived the spec from the schema: the publisher's form of it came with the entry
        assert metric(other, 'corral_schema_forms_total{source="seeded"}') == 1
        assert metric(other, 'corral_schema_forms_total{source="remembered"}') == 1
        assert metric(other, 'corral_schema_forms_total{source="derived"}') == 0
    finally:
        stop_server(other)
