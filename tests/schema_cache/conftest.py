"""schema_cache fixtures: a compile service on a fresh cache folder per test."""

from __future__ import annotations

import pytest

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
