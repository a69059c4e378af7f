"""Helpers shared by the schema_cache tests (imported by name; not a test module)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from corral.grammar import ConstraintSpec

HERE = Path(__file__).resolve().parent
CHILD = HERE / "schema_cache_child.py"


def alive(pid: int) -> bool:
    """Whether a process with this id exists (a reaped worker's does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def regex_specs(n: int, tag: str = "r") -> list[ConstraintSpec]:
    """n distinct, quick-to-compile regex constraints."""
    return [ConstraintSpec.regex(rf"{tag}{i}-[a-z]{{2,8}}\d+") for i in range(n)]


def entry_files(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*.cc") if p.is_file())


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def nested_one_of(depth: int, width: int = 3) -> dict:
    """oneOf nested ``depth`` levels deep, written out in full: its size grows as width**depth."""
    schema: dict = {"type": "string"}
    for d in range(depth):
        schema = {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {f"k{d}_{i}": schema, "n": {"type": "integer"}},
                    "required": [f"k{d}_{i}"],
                    "additionalProperties": False,
                }
                for i in range(width)
            ]
        }
    return schema


def rewrite_header(data: bytes, **changes: object) -> bytes:
    """An entry with fields of its JSON header changed (the payload and checksum kept)."""
    magic_len = len(b"CORRALCC")
    (n,) = struct.unpack_from("<I", data, magic_len)
    start = magic_len + 4
    header = json.loads(data[start : start + n])
    header.update(changes)
    new = json.dumps(header).encode()
    return data[:magic_len] + struct.pack("<I", len(new)) + new + data[start + n :]


def start_child(root: Path, *args: str) -> subprocess.Popen:
    """Run schema_cache_child.py against the cache at ``root``; it prints one JSON line."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def child_replica(tmp_path: Path, redis_url: str, make_service) -> tuple:
    """Two replicas sharing one Redis, each with its own disk cache: a child process (started,
    ready, waiting for ``sync / "go"``) and a service in this one. Returns (child, here, sync)."""
    sync = tmp_path / "sync"
    sync.mkdir()
    child = start_child(tmp_path / "child-disk", str(sync), redis_url)
    here = make_service(redis_url=redis_url)
    wait_until(lambda: list(sync.glob("ready-*")), 300, "the child to get ready")
    return child, here, sync


def finish_child(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


SLOW_ALTERNATIVES = 60_000  # an EBNF grammar a worker takes seconds on (then refuses)


def slow_ebnf(n: int = SLOW_ALTERNATIVES, tag: str = "w") -> ConstraintSpec:
    return ConstraintSpec.ebnf("root ::= " + " | ".join(f'"{tag}{i}"' for i in range(n)))


def in_background(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def wait_until(predicate, timeout: float = 30.0, what: str = "the condition") -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.02)


def accepts(service, spec: ConstraintSpec, text: str) -> bool:
    ids = service.tok.encode(text)
    m = service.get_or_compile(spec).matcher()
    return m.accept_tokens(ids) == len(ids) and m.can_terminate()
