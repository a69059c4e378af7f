"""schema_cache fixtures: a compile service on a fresh cache folder per test; a real Redis;
the key file a test's replicas share (the Redis tier needs one)."""

from __future__ import annotations

import pytest
from redis_server import RedisServer
from schema_cache_helpers import write_key_file

from corral.schema_cache import CacheConfig, CompileService


@pytest.fixture
def cache_root(tmp_path):
    return tmp_path / "constraints"


@pytest.fixture
def key_file(tmp_path):
    """A key file for this test (mode 0600), shared by its replicas."""
    return write_key_file(tmp_path / "fleet.key")


@pytest.fixture
def make_service(llama3_tokenizer, cache_root, key_file):
    """Build CompileServices on this test's cache folder; all are closed after the test. With
    a Redis URL, they seal under ``key_file`` unless told otherwise."""
    made: list[CompileService] = []

    def make(**config) -> CompileService:
        config.setdefault("root", cache_root)
        config.setdefault("isolation", "thread")
        if config.get("redis_url") is not None:
            config.setdefault("key_file", key_file)
        service = CompileService(llama3_tokenizer, CacheConfig(**config))
        made.append(service)
        return service

    yield make
    for service in made:
        service.close()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis(redis_server):
    """A client of this module's redis-server, running and empty at the start of each test."""
    if redis_server.proc is None:
        redis_server.start()
    with redis_server.client() as client:
        client.flushall()
        yield client
