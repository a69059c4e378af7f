"""The shared Redis tier against a real redis-server: one compile per fleet, a dead compiler's
lock expiring, Redis stopped or hung mid-run (served locally, reported as degraded, back once
Redis is), and corrupt or old-version entries in Redis recompiled and replaced."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

from schema_cache_child import specs
from schema_cache_helpers import (
    accepts,
    child_replica,
    finish_child,
    opened_entry,
    regex_specs,
    sealed_entry,
    wait_until,
)

from corral.grammar import CompiledConstraint, ConstraintSpec
from corral.grammar.core.version import ANALYSIS_VERSION
from corral.schema_cache import entry_key
from corral.schema_cache.redis_store import PREFIX

STALL_S = 2.0  # no lookup takes longer than this while Redis is down or hung


def redis_key(service, spec: ConstraintSpec) -> str:
    return PREFIX + entry_key(spec.digest, service.tok.fingerprint)


def test_two_processes_sharing_redis_compile_each_constraint_once(
    redis, redis_server, make_service, tmp_path, key_file
):
    # Two replicas, each with its own disk cache and one Redis between them: a child process
    # and this one, going through the same constraints at the same moment.
    child, here, sync = child_replica(tmp_path, redis_server.url, make_service, key_file)
    (sync / "go").touch()
    assert all(accepts(here, spec, text) for spec, text in specs())
    assert here.flush(timeout=30)
    mine = here.stats()
    theirs = finish_child(child)
    assert theirs["all_accepted"]
    n = len(specs())
    assert mine["compiles"] + theirs["compiles"] == n  # each constraint once in the fleet
    for stats in (mine, theirs):  # the others' entries reached each: on request or prefetched
        assert stats["compiles"] + stats["hits_redis"] + stats["prefetched"] == n
    for stats in (mine, theirs):
        assert (stats["hits_disk"], stats["corrupt_entries"], stats["redis_errors"]) == (0, 0, 0)
        assert stats["redis_state"] == "ok"
    keys = redis.keys(PREFIX + "*")
    assert len(keys) == n and not [k for k in keys if k.endswith(b":lock")]


# A replica that compiles one JSON schema (about a second: 3,000 required properties) with a
# lock that lives LOCK_TTL_S past its last renewal, and is killed meanwhile.
COMPILER = """
import json, sys
from corral.fuzz.tokenizers import llama3_tokenizer
from corral.grammar import ConstraintSpec
from corral.schema_cache import CacheConfig, CompileService
root, url, ttl, schema = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4])
key_file = sys.argv[5]
tok = llama3_tokenizer()
_ = tok.llguidance
config = CacheConfig(
    root=root, redis_url=url, redis_lock_ttl_s=ttl, isolation="thread", key_file=key_file
)
service = CompileService(tok, config)
print("ready", flush=True)
service.get_or_compile(ConstraintSpec.json_schema(schema))
"""
LOCK_TTL_S = 2.0
WIDE = {
    "type": "object",
    "properties": {f"p{i}": {"type": "integer"} for i in range(3000)},
    "required": [f"p{i}" for i in range(3000)],
}


def test_a_killed_compilers_lock_expires_and_another_replica_compiles(
    redis, redis_server, make_service, tmp_path, key_file
):

    spec = ConstraintSpec.json_schema(WIDE)
    service = make_service(redis_url=redis_server.url)
    entry = redis_key(service, spec)
    lock = entry + ":lock"
    cmd = [sys.executable, "-c", COMPILER, str(tmp_path / "dead"), redis_server.url,
           str(LOCK_TTL_S), json.dumps(WIDE), str(key_file)]  # fmt: skip
    compiler = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert compiler.stdout.readline().strip() == "ready"
        wait_until(lambda: redis.keys(PREFIX + "*") or compiler.poll() is not None, 120,
                   "the compiler to take a lock")  # fmt: skip
        compiler.kill()  # mid-compile, holding the lock
        assert redis.keys(PREFIX + "*") == [lock.encode()], "it locked another key, or finished"
        compiler.wait()
    finally:
        compiler.kill()
    left_ms = redis.pttl(lock)
    assert 0 < left_ms <= LOCK_TTL_S * 1000 and not redis.exists(entry)

    t0 = time.monotonic()
    found = service.lookup(spec)
    waited = time.monotonic() - t0
    assert found.source == "compiled"
    assert waited >= left_ms / 1000 - 0.05  # it waited for the lock to expire, not stole it
    stats = service.stats()
    assert (stats["redis_lock_waits"], stats["compiles"], stats["hits_redis"]) == (1, 1, 0)
    assert service.flush(timeout=30)
    assert not redis.exists(lock)
    data = opened_entry(service, spec, redis.get(entry))
    shared = CompiledConstraint.from_bytes(data, service.tok, spec_digest=spec.digest)
    text = json.dumps({f"p{i}": i for i in range(3000)}, separators=(",", ":"))
    ids = service.tok.encode(text)
    m = shared.matcher()
    assert m.accept_tokens(ids) == len(ids) and m.can_terminate()


def test_redis_stopped_mid_run_is_served_locally_and_reported_until_it_is_back(
    redis, redis_server, make_service, tmp_path
):
    service = make_service(redis_url=redis_server.url, redis_retry_s=0.3)
    before, during, after = (regex_specs(2, tag=t) for t in ("up", "down", "back"))
    for i, spec in enumerate(before):
        assert accepts(service, spec, f"up{i}-ab1")
    assert service.flush(timeout=30) and len(redis.keys(PREFIX + "*")) == 2
    assert service.degraded() == {}

    redis_server.stop()
    for i, spec in enumerate(before):  # from memory
        assert accepts(service, spec, f"up{i}-cd2")
    for i, spec in enumerate(during):  # compiled here, each without waiting for Redis
        t0 = time.monotonic()
        assert service.lookup(spec).source == "compiled"
        assert time.monotonic() - t0 < STALL_S
        assert accepts(service, spec, f"down{i}-ef3")
    stats = service.stats()
    assert stats["redis_state"] == "down" and stats["compiles"] == 4
    assert stats["redis_errors"] == 1  # the first failure opened the circuit: no more tries
    why = service.degraded()["shared_cache"]
    assert redis_server.url in why and "unreachable" in why
    # A replica that starts while Redis is down serves too, and says so from the start.
    late = make_service(root=tmp_path / "late", redis_url=redis_server.url)
    assert late.stats()["redis_state"] == "down"
    assert accepts(late, during[0], "down0-gh4")

    redis_server.start()  # back, empty
    wait_until(lambda: service.degraded() == {}, 10, "the service to find Redis again")
    for spec in after:
        assert service.lookup(spec).source == "compiled"
    assert service.flush(timeout=30)
    assert {redis_key(service, s).encode() for s in after} <= set(redis.keys(PREFIX + "*"))
    assert service.stats()["redis_state"] == "ok"


def test_a_hung_redis_costs_one_short_timeout_then_is_left_alone(redis, redis_server, make_service):
    service = make_service(redis_url=redis_server.url, redis_timeout_s=0.2, redis_retry_s=0.3)
    specs_ = regex_specs(3, tag="hung")
    os.kill(redis_server.proc.pid, signal.SIGSTOP)  # it accepts connections, answers nothing
    try:
        for i, spec in enumerate(specs_):
            t0 = time.monotonic()
            assert accepts(service, spec, f"hung{i}-ab1")
            assert time.monotonic() - t0 < STALL_S
        stats = service.stats()
        assert (stats["redis_errors"], stats["compiles"], stats["redis_state"]) == (1, 3, "down")
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    wait_until(lambda: service.degraded() == {}, 10, "the service to find Redis again")


def test_corrupt_and_old_version_redis_entries_are_recompiled_and_replaced(
    redis, redis_server, make_service, tmp_path
):
    specs_ = regex_specs(3, tag="bad")
    writer = make_service(root=tmp_path / "writer", redis_url=redis_server.url)
    compiled = [writer.get_or_compile(s) for s in specs_]
    assert writer.flush(timeout=30)
    keys = [redis_key(writer, s) for s in specs_]
    redis.set(keys[0], redis.get(keys[0])[:40])  # truncated
    # An intact, sealed entry that an older Corral wrote (same key, other analysis version).
    old = dataclasses.replace(compiled[1], analysis_version="0" * 64).to_bytes()
    redis.set(keys[1], sealed_entry(writer, specs_[1], old))

    reader = make_service(root=tmp_path / "reader", redis_url=redis_server.url)
    assert [reader.lookup(s).source for s in specs_] == ["compiled", "compiled", "redis"]
    stats = reader.stats()
    assert (stats["corrupt_entries"], stats["stale_entries"]) == (1, 1)
    assert stats["rejected_entries"]["redis/truncated"] == 1
    assert (stats["compiles"], stats["hits_redis"]) == (2, 1)
    assert all(accepts(reader, s, f"bad{i}-xy7") for i, s in enumerate(specs_))
    assert reader.flush(timeout=30)
    for spec, key in zip(specs_, keys, strict=True):  # replaced by valid, current entries
        data = opened_entry(reader, spec, redis.get(key))
        entry = CompiledConstraint.from_bytes(data, reader.tok, spec_digest=spec.digest)
        assert entry.analysis_version == ANALYSIS_VERSION
