"""Prefetch against a real redis-server: an entry another replica (a separate process)
compiles is in this one's memory before anything asks for it; a request that arrives while it
loads joins the load; entries of another tokenizer are ignored; Redis stopped and started again
costs no error, and prefetching resumes."""

from __future__ import annotations

import json
import logging

from schema_cache_child import specs
from schema_cache_helpers import (
    accepts,
    child_replica,
    finish_child,
    regex_specs,
    wait_until,
)

from corral.fuzz.tokenizers import llama3_tokenizer_path
from corral.grammar import ConstraintSpec, TokenizerInfo
from corral.schema_cache import CacheConfig, CompileService
from corral.schema_cache.prefetch import read_spec, spec_bytes, spec_from_bytes
from corral.schema_cache.redis_store import ANNOUNCE

# About half a second to compile and as long to load: long enough to catch a load in flight.
WIDE = {
    "type": "object",
    "properties": {f"p{i}": {"type": "integer"} for i in range(3000)},
    "required": [f"p{i}" for i in range(3000)],
}


def listeners(redis) -> int:
    """How many replicas listen to the announcements now."""
    return dict(redis.pubsub_numsub(ANNOUNCE)).get(ANNOUNCE.encode(), 0)


def test_an_entry_another_process_compiles_is_in_memory_here_before_anyone_asks(
    redis, redis_server, make_service, tmp_path, key_file
):
    child, here, sync = child_replica(tmp_path, redis_server.url, make_service, key_file)
    wait_until(lambda: listeners(redis) == 1, 10, "this replica to listen")
    (sync / "go").touch()
    theirs = finish_child(child)  # it compiled everything and published it
    n = len(specs())
    assert theirs["all_accepted"] and theirs["compiles"] == n
    assert theirs["prefetched"] + theirs["prefetch_skipped"] == 0  # its own, not announced to it
    wait_until(lambda: here.stats()["prefetched"] == n, 60, "the announced entries to load")
    for spec, text in specs():
        assert here.lookup(spec).source == "memory"
        assert accepts(here, spec, text)
    stats = here.stats()
    assert (stats["compiles"], stats["hits_redis"], stats["hits_disk"]) == (0, 0, 0)
    assert (stats["prefetch_skipped"], stats["prefetch_foreign"], stats["redis_errors"]) == (
        0,
        0,
        0,
    )


def test_a_request_during_the_load_joins_it_instead_of_loading_again(
    redis, redis_server, make_service, tmp_path
):
    spec = ConstraintSpec.json_schema(WIDE)
    publisher = make_service(root=tmp_path / "publisher", redis_url=redis_server.url)
    here = make_service(redis_url=redis_server.url)
    wait_until(lambda: listeners(redis) == 2, 10, "both replicas to listen")
    publisher.get_or_compile(spec)
    wait_until(here._flights.busy, 30, "the prefetch to start loading")
    found = here.lookup(spec)
    assert found.source == "shared"  # it waited for the prefetch's load
    stats = here.stats()
    assert (stats["prefetched"], stats["singleflight_joins"]) == (1, 1)
    assert (stats["compiles"], stats["hits_redis"]) == (0, 0)
    ids = here.tok.encode('{"p0":1')
    assert found.compiled.matcher().accept_tokens(ids) == len(ids)


def test_entries_of_another_tokenizer_are_ignored(
    redis, redis_server, make_service, tmp_path, key_file
):
    here = make_service(redis_url=redis_server.url)
    # Llama-3's tokenizer ending turns on <|end_of_text|> only: another fingerprint, other keys.
    other = TokenizerInfo.from_tokenizer_json(
        llama3_tokenizer_path(), vocab_size=128256, eos_token_ids=[128001]
    )
    config = CacheConfig(
        root=tmp_path / "other", redis_url=redis_server.url, isolation="thread", key_file=key_file
    )
    specs_ = regex_specs(3, tag="tok")
    with CompileService(other, config) as foreign:
        wait_until(lambda: listeners(redis) == 2, 10, "both replicas to listen")
        for spec in specs_:
            foreign.get_or_compile(spec)
        assert foreign.flush(timeout=30)
        wait_until(lambda: here.stats()["prefetch_foreign"] == 3, 30, "the announcements")
        stats = here.stats()
        assert (stats["prefetched"], stats["memory_entries"], stats["hits_redis"]) == (0, 0, 0)
        assert [here.lookup(s).source for s in specs_] == ["compiled"] * 3  # its own keys
        assert here.flush(timeout=30)  # and the other way round:
        wait_until(lambda: foreign.stats()["prefetch_foreign"] == 3, 30, "the announcements")
        assert foreign.stats()["prefetched"] == 0


def test_redis_stopped_costs_no_error_and_prefetching_resumes_once_it_is_back(
    redis, redis_server, make_service, tmp_path, caplog
):
    caplog.set_level(logging.WARNING)
    publisher = make_service(
        root=tmp_path / "publisher", redis_url=redis_server.url, redis_retry_s=0.3
    )
    here = make_service(redis_url=redis_server.url, redis_retry_s=0.3)
    wait_until(lambda: listeners(redis) == 2, 10, "both replicas to listen")
    before, during, after = (regex_specs(2, tag=t) for t in ("up", "down", "back"))
    for spec in before:
        publisher.get_or_compile(spec)
    wait_until(lambda: here.stats()["prefetched"] == 2, 30, "the first entries to load")

    redis_server.stop()
    wait_until(lambda: here.degraded(), 10, "the listener to find Redis gone")
    for i, spec in enumerate(during):  # served here, compiled locally
        assert accepts(here, spec, f"down{i}-ab1")
        assert accepts(publisher, spec, f"down{i}-cd2")
    assert [here.lookup(s).source for s in before] == ["memory", "memory"]

    redis_server.start()  # back, empty
    wait_until(lambda: here.degraded() == {}, 10, "the service to find Redis again")
    wait_until(lambda: publisher.degraded() == {}, 10, "the publisher to find Redis again")
    wait_until(lambda: listeners(redis) == 2, 10, "both replicas to listen again")
    for spec in after:
        publisher.get_or_compile(spec)
    wait_until(lambda: here.stats()["prefetched"] == 4, 30, "the later entries to load")
    assert [here.lookup(s).source for s in after] == ["memory", "memory"]
    stats = here.stats()
    assert stats["redis_errors"] == 1  # the listener found it gone; requests never tried it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_without_prefetch_nothing_listens(redis, redis_server, make_service, tmp_path):
    publisher = make_service(root=tmp_path / "publisher", redis_url=redis_server.url)
    here = make_service(redis_url=redis_server.url, redis_prefetch=False)
    spec = regex_specs(1, tag="off")[0]
    publisher.get_or_compile(spec)
    assert publisher.flush(timeout=30)
    assert listeners(redis) == 1  # the publisher's
    assert here.lookup(spec).source == "redis"
    assert here.stats()["prefetched"] == 0


def test_a_prefetched_constraint_is_prepared_before_its_first_request(
    redis, redis_server, llama3_tokenizer, tmp_path, key_file
):
    """The server's per-constraint preparation (the API's budget closer and schema forms) runs
    on the constraint published beside the entry, with what the publisher's ``describe`` said
    about it, checked against the announced digest, before the entry counts as prefetched; a
    spec that is not the announced one is never prepared."""
    spec = ConstraintSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    prepared: list[tuple[ConstraintSpec, dict]] = []
    said = {"forms": [["said by the publisher"]], "n": 1}
    here_config = CacheConfig(
        root=tmp_path / "here", redis_url=redis_server.url, isolation="thread", key_file=key_file
    )
    there_config = CacheConfig(
        root=tmp_path / "publisher", redis_url=redis_server.url, isolation="thread",
        key_file=key_file,
    )  # fmt: skip
    with (
        CompileService(
            llama3_tokenizer, here_config, prepare=lambda s, e: prepared.append((s, e))
        ) as here,
        CompileService(llama3_tokenizer, there_config, describe=lambda s: said) as publisher,
    ):
        wait_until(lambda: listeners(redis) == 2, 10, "both replicas to listen")
        publisher.get_or_compile(spec)
        wait_until(lambda: here.stats()["prefetched"] == 1, 30, "the entry to load")
        assert prepared == [(spec, said)] and prepared[0][0].digest == spec.digest
        assert here.lookup(spec).source == "memory"
    other = ConstraintSpec.json_schema({"type": "string"})
    assert spec_from_bytes(spec_bytes(other), spec.digest) is None
    assert spec_from_bytes(b"{not json", spec.digest) is None
    assert spec_from_bytes(spec_bytes(spec), spec.digest) == spec
    assert read_spec(spec_bytes(spec, said), spec.digest) == (spec, said)
    # an extra that is not an object is dropped, the spec kept
    data = json.loads(spec_bytes(spec)) | {"extra": ["not", "an", "object"]}
    assert read_spec(json.dumps(data).encode(), spec.digest) == (spec, {})
