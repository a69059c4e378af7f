"""Faults through real code paths: a worker killed mid-compile, a stray lark.py in the working
directory, a read-only and a full cache directory. Every compile is still answered (or, for the
killed worker, a CompileUnavailable the client may retry); nothing raises anything else."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from schema_cache_child import JSON_SCHEMA, JSON_VALID
from schema_cache_helpers import (
    accepts,
    entry_files,
    in_background,
    regex_specs,
    slow_ebnf,
    wait_until,
)

from corral.base.supervisor import worker_env
from corral.grammar import CompileUnavailable, ConstraintError, ConstraintSpec
from corral.schema_cache import entry_key


def test_a_worker_killed_mid_compile_is_unavailable_and_is_replaced(make_service):
    service = make_service(isolation="process", compile_deadline_s=120)
    assert accepts(service, ConstraintSpec.ebnf('root ::= "yes" | "no"'), "yes")
    [pid] = service.worker_pids()
    t, out = in_background(service.get_or_compile, slow_ebnf())
    wait_until(lambda: service.stats()["compiles_in_worker"] == 2, what="the compile to start")
    time.sleep(0.5)  # well inside a compile of several seconds
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    error = out.get("error")
    assert isinstance(error, CompileUnavailable), out
    assert (error.code, error.retry_after_s) == ("compile_worker_failed", 1)
    stats = service.stats()
    assert (stats["worker_failures"], stats["worker_restarts"], stats["hits_failure"]) == (1, 1, 0)
    # The next compile works, in a fresh worker; the failure was not cached as a refusal.
    assert accepts(service, ConstraintSpec.ebnf('root ::= "up" | "down"'), "down")
    assert pid not in service.worker_pids()
    with pytest.raises(ConstraintError) as err:  # compiled this time: a refusal, not a 503
        service.get_or_compile(slow_ebnf(20_000))
    assert err.value.limit == "max_items_in_row"


def test_a_worker_does_not_import_from_the_servers_working_directory(
    make_service, tmp_path, monkeypatch
):
    import lark  # noqa: F401  (the real package, cached here before the directory changes)

    cwd = tmp_path / "server-cwd"
    cwd.mkdir()
    (cwd / "lark.py").write_text("raise ImportError('the lark.py of the working directory')\n")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", os.pathsep + "relative-dir")
    env = worker_env()
    assert env["PYTHONPATH"] == str(cwd / "relative-dir")  # no empty entry (= the cwd)
    service = make_service(isolation="process")
    # EBNF goes through llguidance's GBNF converter, which imports lark.
    assert accepts(service, ConstraintSpec.ebnf('root ::= "yes" | "no"'), "no")
    assert service.stats()["worker_failures"] == 0


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a fresh tmpfs of that size (e.g. "64k"), unmounted after the test."""
    mounted: list = []

    def mount(size: str):
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_read_only_cache_directory_serves_what_it_has_and_compiles_the_rest(make_service, tmpfs):
    where = tmpfs("4m")
    root = where / "constraints"
    old, new = regex_specs(3, tag="old"), regex_specs(3, tag="new")
    writer = make_service(root=root)
    for spec in old:
        writer.get_or_compile(spec)
    schema = ConstraintSpec.json_schema(JSON_SCHEMA)
    writer.get_or_compile(schema)
    writer.flush()
    fp = writer.tok.fingerprint
    victim = Path(writer.disk.path_for(entry_key(schema.digest, fp), fp))
    victim.write_bytes(victim.read_bytes()[:40])  # a corrupt entry too
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    with pytest.raises(OSError) as err:
        (root / "probe").write_text("x")
    assert err.value.errno == errno.EROFS

    service = make_service(root=root)
    for i, spec in enumerate(old):
        assert accepts(service, spec, f"old{i}-ab1")
    assert accepts(service, ConstraintSpec.json_schema(JSON_SCHEMA), JSON_VALID)
    for i, spec in enumerate(new):
        assert accepts(service, spec, f"new{i}-xy7")
    assert service.flush(timeout=30)
    stats = service.stats()
    assert stats["hits_disk"] == 3 and stats["corrupt_entries"] == 1
    assert stats["compiles"] == 4 and stats["disk_write_errors"] == 4
    assert all(accepts(service, s, f"new{i}-zz0") for i, s in enumerate(new))  # from memory


def test_a_full_cache_directory_is_counted_and_compiles_are_still_answered(
    make_service, tmpfs, key_file
):
    where = tmpfs("256k")
    root = where / "constraints"
    root.mkdir()
    try:  # fill it: writes then fail with ENOSPC
        with open(where / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError as e:
        assert e.errno == errno.ENOSPC
    service = make_service(root=root, key_file=key_file)  # no room for a new key
    specs = regex_specs(4, tag="full")
    for i, spec in enumerate(specs):
        assert accepts(service, spec, f"full{i}-ab1")
    assert service.flush(timeout=30)
    stats = service.stats()
    assert stats["disk_write_errors"] == 4 and stats["disk_writes"] == 0
    assert entry_files(root) == []
    assert not [p for p in root.rglob("*") if p.is_file()]  # no temp file left behind
    assert all(accepts(service, s, f"full{i}-qq9") for i, s in enumerate(specs))
    assert service.stats()["hits_memory"] >= 4
