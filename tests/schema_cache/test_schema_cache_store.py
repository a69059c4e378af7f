"""The disk store: hits across processes, corrupt entries, concurrent writers, the size bound."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from schema_cache_child import JSON_SCHEMA, JSON_VALID, specs
from schema_cache_helpers import (
    disk_bytes,
    entry_files,
    finish_child,
    in_frame,
    regex_specs,
    rewrite_header,
    start_child,
)

from corral.grammar import ConstraintSpec, compile_constraint
from corral.schema_cache import entry_key


def accepts(compiled, tok, text: str) -> bool:
    ids = tok.encode(text)
    m = compiled.matcher()
    return m.accept_tokens(ids) == len(ids) and m.can_terminate()


def test_memory_hit_returns_the_same_object(make_service):
    service = make_service()
    spec = regex_specs(1)[0]
    first = service.get_or_compile(spec)
    assert service.get_or_compile(spec) is first
    stats = service.stats()
    assert (stats["compiles"], stats["hits_memory"], stats["hits_disk"]) == (1, 1, 0)


def test_compiled_here_then_loaded_in_a_new_process_without_compiling(make_service, cache_root):
    service = make_service()
    for spec, _ in specs():
        service.get_or_compile(spec)
    service.flush()  # entries are written behind the compile
    assert len(entry_files(cache_root)) == len(specs())
    child = finish_child(start_child(cache_root))
    assert child["compiles"] == 0
    assert child["hits_disk"] == len(specs())
    assert child["corrupt_entries"] == 0
    assert child["all_accepted"]


def test_two_processes_compiling_the_same_constraints_at_once(make_service, cache_root, tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    children = [start_child(cache_root, str(sync)) for _ in range(2)]
    t0 = time.monotonic()
    while len(list(sync.glob("ready-*"))) < 2:
        assert all(c.poll() is None for c in children), "a child exited before it was ready"
        assert time.monotonic() - t0 < 300, "the children did not get ready"
        time.sleep(0.05)
    (sync / "go").touch()
    for result in [finish_child(c) for c in children]:
        assert result["all_accepted"]
        assert result["compile_errors"] == 0 and result["corrupt_entries"] == 0
        assert result["compiles"] + result["hits_disk"] == len(specs())
    # Whatever the interleaving, every entry on disk is whole and valid.
    reader = make_service()
    for spec, text in specs():
        assert accepts(reader.get_or_compile(spec), reader.tok, text)
    stats = reader.stats()
    assert (stats["hits_disk"], stats["compiles"], stats["corrupt_entries"]) == (len(specs()), 0, 0)
    assert not list(cache_root.rglob("*.tmp")), "a writer left its temp file behind"


def _flip_tail(data: bytes) -> bytes:
    return data[:-8] + bytes(b ^ 0x5A for b in data[-8:])


MANGLERS = {
    "truncated": lambda d: d[: len(d) // 2],
    "truncated_in_header": lambda d: d[:20],
    "empty": lambda d: b"",
    "garbled_payload": _flip_tail,
    "garbled_header": lambda d: d[:12] + b"\xff" * 16 + d[28:],
    "random_bytes": lambda d: os.urandom(len(d)),
    "foreign_format_version": in_frame(lambda d: rewrite_header(d, format=999)),
    "foreign_backend_version": in_frame(
        lambda d: rewrite_header(d, backend_version="0.0.0-elsewhere")
    ),
    "foreign_tokenizer": in_frame(lambda d: rewrite_header(d, tokenizer="0" * 64)),
    "another_constraint": in_frame(lambda d: rewrite_header(d, spec_digest="1" * 64)),
}


@pytest.mark.parametrize("mangle", list(MANGLERS.values()), ids=list(MANGLERS))
def test_a_corrupt_entry_is_a_counted_miss_and_is_recompiled(make_service, cache_root, mangle):
    spec = ConstraintSpec.json_schema(JSON_SCHEMA)
    writer = make_service()
    writer.get_or_compile(spec)
    writer.flush()
    [path] = entry_files(cache_root)
    path.write_bytes(mangle(path.read_bytes()))

    service = make_service()
    compiled = service.get_or_compile(spec)
    assert accepts(compiled, service.tok, JSON_VALID)
    assert not accepts(compiled, service.tok, '{"name":"Ada"}')
    stats = service.stats()
    assert (stats["corrupt_entries"], stats["compiles"], stats["hits_disk"]) == (1, 1, 0)
    service.flush()

    # The recompiled entry replaced the corrupt one.
    again = make_service()
    again.get_or_compile(spec)
    assert (again.stats()["hits_disk"], again.stats()["corrupt_entries"]) == (1, 0)


def _entry_sizes(tok, specs_: list) -> list[int]:
    return [len(compile_constraint(s, tok).to_bytes()) for s in specs_]


def test_the_disk_stays_within_its_budget(make_service, cache_root, llama3_tokenizer):
    specs_ = regex_specs(40)
    budget = max(_entry_sizes(llama3_tokenizer, specs_[:3])) * 10
    service = make_service(max_disk_bytes=budget)
    for spec in specs_:
        service.get_or_compile(spec)
        service.flush()
        assert disk_bytes(cache_root) <= budget
    stats = service.stats()
    assert stats["evictions_disk"] >= 25
    assert stats["disk_bytes"] == disk_bytes(cache_root)
    assert len(entry_files(cache_root)) >= 5  # eviction stops at the low-water mark
    assert service.get_or_compile(specs_[0]) is not None  # evicted from disk, still in memory


def test_eviction_removes_the_least_recently_used_first(make_service, cache_root, llama3_tokenizer):
    specs_ = regex_specs(12, tag="lru")
    budget = max(_entry_sizes(llama3_tokenizer, specs_)) * 10
    writer = make_service(max_disk_bytes=budget)
    fp = llama3_tokenizer.fingerprint
    paths = [Path(writer.disk.path_for(entry_key(s.digest, fp), fp)) for s in specs_]
    for i, spec in enumerate(specs_[:8]):
        writer.get_or_compile(spec)
        writer.flush()
        os.utime(paths[i], (1_000_000 + i, 1_000_000 + i))  # a clear, old use order

    reader = make_service(max_disk_bytes=budget)
    reader.get_or_compile(specs_[0])  # a disk hit makes the oldest entry the newest
    assert reader.stats()["hits_disk"] == 1
    for spec in specs_[8:]:
        reader.get_or_compile(spec)
    reader.flush()
    assert disk_bytes(cache_root) <= budget
    assert paths[0].exists(), "the entry just used was evicted"
    assert not paths[1].exists() and not paths[2].exists(), "the least recently used survived"
    assert all(p.exists() for p in paths[8:])


def test_an_entry_larger_than_the_whole_budget_is_served_but_not_stored(make_service, cache_root):
    service = make_service(max_disk_bytes=4096)
    small = regex_specs(3)
    for spec in small:
        service.get_or_compile(spec)
    big = ConstraintSpec.regex("(" + "|".join(f"option-{i}" for i in range(3000)) + ")")
    compiled = service.get_or_compile(big)
    assert len(compiled.to_bytes()) > 4096
    assert accepts(compiled, service.tok, "option-1234")
    assert service.get_or_compile(big) is compiled
    service.flush()
    stats = service.stats()
    assert stats["disk_write_skipped"] == 1 and stats["evictions_disk"] == 0
    assert len(entry_files(cache_root)) == len(small)
    assert disk_bytes(cache_root) <= 4096


def test_temp_files_of_dead_writers_are_swept(make_service, cache_root):
    service = make_service()
    service.get_or_compile(regex_specs(1)[0])
    service.flush()
    [entry] = entry_files(cache_root)
    stale = entry.with_name(".x.cc.999.dead.tmp")
    young = entry.with_name(".y.cc.999.live.tmp")
    stale.write_bytes(b"partial")
    young.write_bytes(b"partial")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    service.disk.usage()  # a scan, as eviction and `corral cache stats` do
    assert not stale.exists() and young.exists()


def test_entries_reach_the_disk_without_a_flush_once_compiles_go_quiet(make_service, cache_root):
    service = make_service(write_quiet_s=0.05, write_max_delay_s=0.5)
    for spec in regex_specs(3, tag="quiet"):
        service.get_or_compile(spec)
    deadline = time.monotonic() + 5
    while len(entry_files(cache_root)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(entry_files(cache_root)) == 3
