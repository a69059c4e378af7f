"""schema_cache fixtures: a compile service on a fresh cache folder per test; a real Redis."""

from __future__ import annotations

import pytest
from redis_server import RedisServer

from corral.schema_cache import CacheConfig, CompileService


@pytest.fixture
def cache_root(tmp_path):
    return tmp_path / "constraints"


@pytest.fixture
def make_service(llama3_tokenizer, cache_root):
    """Build CompileServices on this test's cache folder; all are closed after the test."""
    made: list[CompileService] = []

    def make(**config) -> CompileService:
        config.setdefault("root", cache_root)
        config.setdefault("isolation", "thread")
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
