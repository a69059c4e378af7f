"""Cache entries never outlive the grammar code that compiled them; the memory LRU is bounded
in bytes; refusals keep the limit they name."""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import shutil
from importlib import metadata
from pathlib import Path

import pytest
from schema_cache_child import JSON_SCHEMA, JSON_VALID
from schema_cache_helpers import entry_files, opened_entry, regex_specs, sealed_entry

import corral.grammar
from corral.grammar import CompiledConstraint, ConstraintError, ConstraintSpec, StaleEntry
from corral.grammar.core.version import (
    ANALYSIS_VERSION,
    COMPILE_DEPENDENCIES,
    analysis_version,
    installed_versions,
    source_digest,
)
from corral.schema_cache import entry_key


def fresh_stamp(folder: Path) -> str:
    """The cache's stamp recomputed here, independently of corral.grammar.core.version: every ``.py``
    under the package (subfolders included) and the installed versions that shape a compile."""
    files = sorted(
        (p for p in folder.rglob("*.py") if "__pycache__" not in p.parts),
        key=lambda p: p.relative_to(folder).as_posix(),
    )
    src = hashlib.sha256()
    for path in files:
        data = path.read_bytes()
        src.update(f"{path.relative_to(folder).as_posix()}\0{len(data)}\0".encode())
        src.update(data)
    versions = {"python": f"{platform.python_implementation()} {platform.python_version()}"}
    for name in ("llguidance", "xgrammar", "interegular", "jsonschema", "referencing"):
        versions[name] = metadata.version(name)
    stamp = hashlib.sha256(f"source\0{src.hexdigest()}\0".encode())
    for name in sorted(versions):
        stamp.update(f"{name}\0{versions[name]}\0".encode())
    return stamp.hexdigest()


def test_the_analysis_version_covers_the_grammar_sources_and_the_backends(tmp_path):
    folder = Path(corral.grammar.__file__).parent
    assert ANALYSIS_VERSION == fresh_stamp(folder)
    assert set(COMPILE_DEPENDENCIES) >= {"llguidance", "xgrammar", "interegular"}
    # It changes with the code: one byte of one source file, at the top or in a subfolder.
    copy = tmp_path / "grammar"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = source_digest(copy)
    assert base == source_digest(folder)
    rewrite = copy / "core" / "version.py"
    rewrite.write_text(rewrite.read_text() + "\n# changed\n")
    assert source_digest(copy) != base
    rewrite.write_text((folder / "core" / "version.py").read_text())
    assert source_digest(copy) == base
    (copy / "deep" / "deeper").mkdir(parents=True, exist_ok=True)
    (copy / "deep" / "deeper" / "added.py").write_text("X = 1\n")
    nested = source_digest(copy)
    assert nested != base
    (copy / "deep" / "deeper" / "added.py").write_text("X = 2\n")
    assert source_digest(copy) not in (base, nested)
    # ... and with the version of Python or of any library that shapes a compile.
    versions = installed_versions()
    assert analysis_version(source_digest(folder), versions) == ANALYSIS_VERSION
    for name in versions:
        bumped = {**versions, name: versions[name] + ".post1"}
        assert analysis_version(source_digest(folder), bumped) != ANALYSIS_VERSION, name
        assert entry_key("d" * 64, "t" * 64, analysis_version(base, bumped)) != entry_key(
            "d" * 64, "t" * 64
        )


def test_an_entry_written_under_another_backend_version_is_a_miss_and_a_recompile(
    make_service, cache_root
):
    """Two installs share a cache folder; the other one has another llguidance. Its entry lies
    where its own key points, which is not where this install looks: a miss, then a compile."""
    spec = ConstraintSpec.json_schema(JSON_SCHEMA)
    writer = make_service()
    compiled = writer.get_or_compile(spec)
    writer.flush()
    [ours] = entry_files(cache_root)
    other_version = {**installed_versions(), "llguidance": "0.0.1"}
    other_key = entry_key(
        spec.digest, writer.tok.fingerprint, analysis_version(source_digest(), other_version)
    )
    theirs = Path(writer.disk.path_for(other_key, writer.tok.fingerprint))
    theirs.parent.mkdir(parents=True, exist_ok=True)
    theirs.write_bytes(writer.sealer.seal_entry(other_key, compiled.to_bytes()))
    ours.unlink()

    reader = make_service()
    found = reader.lookup(spec)
    assert found.source == "compiled"
    assert (reader.stats()["compiles"], reader.stats()["hits_disk"]) == (1, 0)
    ids = reader.tok.encode(JSON_VALID)
    assert found.compiled.matcher().accept_tokens(ids) == len(ids)
    reader.flush()
    assert sorted(entry_files(cache_root)) == sorted([theirs, ours])


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
    path.write_bytes(sealed_entry(writer, spec, old.to_bytes()))
    with pytest.raises(StaleEntry):
        CompiledConstraint.from_bytes(old.to_bytes(), writer.tok)

    service = make_service()
    found = service.lookup(spec)
    assert found.source == "compiled"
    ids = service.tok.encode(JSON_VALID)
    assert found.compiled.matcher().accept_tokens(ids) == len(ids)
    stats = service.stats()
    assert (stats["stale_entries"], stats["compiles"], stats["hits_disk"]) == (1, 1, 0)
    service.flush()
    entry = opened_entry(service, spec, path.read_bytes())
    assert CompiledConstraint.from_bytes(entry, service.tok).analysis_version == ANALYSIS_VERSION


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
