"""Cache entries never outlive the grammar code that compiled them; the memory LRU is bounded
in bytes; refusals keep the limit they name."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pytest
from schema_cache_child import JSON_SCHEMA, JSON_VALID
from schema_cache_helpers import entry_files, regex_specs

import corral.grammar
from corral.grammar import CompiledConstraint, ConstraintError, ConstraintSpec, StaleEntry
from corral.grammar.version import ANALYSIS_VERSION, source_digest
from corral.schema_cache import entry_key


def fresh_digest(folder: Path) -> str:
    """The grammar package's sources hashed here, independently of corral.grammar.version."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def test_the_analysis_version_is_a_digest_of_the_grammar_sources(tmp_path):
    folder = Path(corral.grammar.__file__).parent
    assert ANALYSIS_VERSION == fresh_digest(folder)
    # It changes with the code: one byte of one source file.
    copy = tmp_path / "grammar"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
    rewrite = copy / "schema_rewrite.py"
    rewrite.write_text(rewrite.read_text() + "\n# changed\n")
    assert source_digest(copy) != ANALYSIS_VERSION
    assert entry_key("d" * 64, "t" * 64, "other") != entry_key("d" * 64, "t" * 64)


def test_an_entry_from_another_analysis_version_is_a_counted_miss_never_served(
    make_service, cache_root
):
    spec = ConstraintSpec.json_schema(JSON_SCHEMA)
    writer = make_service()
    compiled = writer.get_or_compile(spec)
    writer.flush()
    [path] = entry_files(cache_root)
    # An intact, sealed entry that an older Corral wrote (same key, other analysis version).
    old = dataclasses.replace(compiled, analysis_version="0" * 64)
    path.write_bytes(old.to_bytes())
    with pytest.raises(StaleEntry):
        CompiledConstraint.from_bytes(path.read_bytes(), writer.tok)

    service = make_service()
    found = service.lookup(spec)
    assert found.source == "compiled"
    ids = service.tok.encode(JSON_VALID)
    assert found.compiled.matcher().accept_tokens(ids) == len(ids)
    stats = service.stats()
    assert (stats["stale_entries"], stats["compiles"], stats["hits_disk"]) == (1, 1, 0)
    service.flush()
    assert CompiledConstraint.from_bytes(path.read_bytes(), service.tok).analysis_version == (
        ANALYSIS_VERSION
    )


def test_the_memory_cache_is_bounded_in_bytes_least_recently_used_first(make_service):
    specs = regex_specs(6, tag="mem")
    probe = make_service(max_disk_bytes=0)
    sizes = [probe.get_or_compile(s).size_bytes for s in specs]
    assert all(s > 64 * 1024 for s in sizes)  # the native form is counted, not just the payload
    budget = sum(sizes[:3])  # room for three of them
    service = make_service(max_disk_bytes=0, max_memory_bytes=budget)
    for spec in specs[:3]:
        service.get_or_compile(spec)
    service.get_or_compile(specs[0])  # now the most recently used
    for spec in specs[3:5]:
        service.get_or_compile(spec)
    stats = service.stats()
    assert stats["memory_bytes"] <= budget and stats["evictions_memory"] == 2
    assert service.memory.get(service_key(service, specs[0])) is not None
    assert service.memory.get(service_key(service, specs[1])) is None
    assert service.memory.get(service_key(service, specs[2])) is None

    tiny = make_service(max_disk_bytes=0, max_memory_bytes=1000)
    tiny.get_or_compile(specs[5])  # larger than the whole budget: served, not kept
    assert len(tiny.memory) == 0 and tiny.stats()["memory_skipped"] == 1


def service_key(service, spec: ConstraintSpec) -> str:
    return entry_key(spec.digest, service.tok.fingerprint)


def test_a_cached_refusal_keeps_the_limit_it_names(make_service):
    service = make_service()
    deep = {"type": "integer"}
    for _ in range(70):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    spec = ConstraintSpec.json_schema(deep)
    for _ in range(2):
        with pytest.raises(ConstraintError) as err:
            service.get_or_compile(spec)
        assert err.value.limit == "recursion_depth"
    assert (service.stats()["compile_failures"], service.stats()["hits_failure"]) == (1, 1)
