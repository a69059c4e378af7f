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
from corral.schema_cache import entry_key

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
    """Bytes of every file under ``root`` but the key (``sealing.KEY_FILE_NAME``: no entry)."""
    files = (p for p in Path(root).rglob("*") if p.is_file() and p.name != "seal.key")
    return sum(p.stat().st_size for p in files)


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


def write_key_file(path: Path, secret: bytes | None = None) -> Path:
    """A key file at ``path``, mode 0600: ``secret``, or 64 random hex digits."""
    path.write_bytes(secret if secret is not None else os.urandom(32).hex().encode())
    path.chmod(0o600)
    return path


def sealed_entry(service, spec: ConstraintSpec, entry: bytes) -> bytes:
    """``entry`` sealed as ``service`` seals ``spec``'s entry (its key, the spec's address)."""
    return service.sealer.seal_entry(entry_key(spec.digest, service.tok.fingerprint), entry)


def opened_entry(service, spec: ConstraintSpec, data: bytes) -> bytes:
    """The entry inside the frame ``service`` stored for ``spec`` (the seal checked)."""
    from corral.schema_cache.sealing import unseal

    key = entry_key(spec.digest, service.tok.fingerprint)
    return unseal(service.sealer.key, "entry:" + key, data)


def forge(data: bytes, **changes: object) -> bytes:
    """An entry (``CompiledConstraint.to_bytes``) with fields of its JSON header changed and
    its sha256 checksum computed again: what anyone can make without the key."""
    from corral.grammar.core.compiled import _seal

    magic_len = len(b"CORRALCC")
    (n,) = struct.unpack_from("<I", data, magic_len)
    start = magic_len + 4
    header, payload = json.loads(data[start : start + n]), data[start + n :]
    header.update(changes)
    header["seal"] = _seal(header, payload)
    new = json.dumps(header).encode()
    return data[:magic_len] + struct.pack("<I", len(new)) + new + payload


FRAME_BYTES = 57  # a sealed frame's fields before the entry (``schema_cache.sealing``)


def in_frame(change):
    """``change`` applied to the entry inside a sealed frame, the frame's MAC kept."""
    return lambda frame: reframe(frame, change(frame[FRAME_BYTES:]))


def reframe(frame: bytes, entry: bytes) -> bytes:
    """A sealed frame with its entry swapped for ``entry`` and its length field made to fit,
    the MAC kept: what anyone can make of a genuine frame without the key."""
    head = 8 + 1 + 8  # magic, version, key id; then the length and the MAC
    return frame[:head] + struct.pack("<Q", len(entry)) + frame[head + 8 : FRAME_BYTES] + entry


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


def child_replica(tmp_path: Path, redis_url: str, make_service, key_file: Path) -> tuple:
    """Two replicas sharing one Redis and ``key_file``, each with its own disk cache: a child
    process (started, ready, waiting for ``sync / "go"``) and a service in this one. Returns
    (child, here, sync)."""
    sync = tmp_path / "sync"
    sync.mkdir()
    child = start_child(tmp_path / "child-disk", str(sync), redis_url, str(key_file))
    here = make_service(redis_url=redis_url, key_file=key_file)
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
