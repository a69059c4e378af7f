"""Sealed cache entries through a real `corral serve` (the default model) and a real
redis-server: a permissive grammar forged under a strict schema's address and a flipped entry
header, written straight into Redis and straight into a replica's cache folder, are never served.
Each request's output validates under its strict schema, `/metrics` counts each rejection by
tier and reason, the server logs it once, and the entry is compiled again and sealed. Without a
key, or with a key file that cannot be used, `--cache-url` refuses to start and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from api_server import start_server, stop_server
from failure_helpers import metric, post, wait_for
from redis_server import RedisServer

from corral.grammar.core.compiled import _seal
from corral.schema_cache.disk import STORE_VERSION, SUFFIX
from corral.schema_cache.redis_store import PREFIX
from corral.schema_cache.sealing import Rejected, SealKey, read_key_file, seal, unseal

REJECTED = "corral_constraint_cache_rejected_entries_total"
PERMISSIVE = {"type": "object"}  # closed by the server: its grammar allows only {}


def strict(name: str) -> dict:
    return {
        "type": "object",
        "properties": {name: {"type": "boolean"}, "why": {"type": "string", "maxLength": 12}},
        "required": [name, "why"],
        "additionalProperties": False,
    }


def key_file(path: Path) -> Path:
    path.write_bytes(os.urandom(32).hex().encode())
    path.chmod(0o600)
    return path


def forge(entry: bytes, **changes: object) -> bytes:
    """``entry`` with header fields changed and its sha256 checksum made to fit (no key needed)."""
    start = len(b"CORRALCC") + 4
    n = int.from_bytes(entry[start - 4 : start], "little")
    header, payload = json.loads(entry[start : start + n]), entry[start + n :]
    header.update(changes)
    header["seal"] = _seal(header, payload)
    raw = json.dumps(header).encode()
    return entry[: start - 4] + len(raw).to_bytes(4, "little") + raw + payload


def reframe(frame: bytes, entry: bytes) -> bytes:
    """A genuine sealed frame around another entry: length fixed, the MAC left as it was."""
    return frame[:17] + len(entry).to_bytes(8, "little") + frame[25:57] + entry


def header_of(entry: bytes) -> dict:
    start = len(b"CORRALCC") + 4
    n = int.from_bytes(entry[start - 4 : start], "little")
    return json.loads(entry[start : start + n])


@pytest.fixture(scope="module")
def shared(model_folder, tmp_path_factory):
    """A Redis, the fleet's key file, and a writer replica that compiles into both."""
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    key = key_file(tmp_path_factory.mktemp("secrets") / "fleet.key")
    args = ("--cache-url", redis.url, "--cache-key-file", str(key), "--max-concurrent", "2",
            "--memory", "256MB")  # fmt: skip
    writer = start_server(model_folder, tmp_path_factory.mktemp("writer"), args)
    yield redis, key, args, writer
    stop_server(writer)
    redis.stop()


def precompiled(server, schema: dict) -> dict:
    r = post(server, {"response_format": _format(schema)}, "/v1/constraints")
    assert r.status_code == 200, r.text
    return r.json()["corral"]


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


#: Each schema's entry, as someone who can write to Redis or the cache folder but has no key
#: would leave it: (tier, the reason it is rejected for).
ATTACKS = {
    "redis_forged": ("redis", "unsealed"),  # a permissive grammar under the strict address
    "redis_flipped": ("redis", "bad_mac"),  # the genuine frame, a header field flipped inside
    "redis_other_key": ("redis", "wrong_key"),  # the forgery, sealed under a key of its own
    "disk_forged": ("disk", "unsealed"),
    "disk_flipped": ("disk", "bad_mac"),
}


def attack(name: str, frame: bytes, entry: bytes, permissive: bytes, address: str) -> bytes:
    forged = forge(permissive, spec_digest=header_of(entry)["spec_digest"])
    if name.endswith("forged"):
        return forged
    if name.endswith("flipped"):
        return reframe(frame, forge(entry, distinct_keys=not header_of(entry)["distinct_keys"]))
    return seal(SealKey(os.urandom(32), "another fleet"), address, forged)


def test_forged_and_flipped_entries_in_redis_and_on_disk_are_never_served(
    shared, model_folder, tmp_path_factory
):
    redis, key_path, args, writer = shared
    with redis.client() as client:
        forged_and_flipped(client, read_key_file(key_path), args, writer, model_folder,
                           tmp_path_factory.mktemp("reader"))  # fmt: skip


def forged_and_flipped(client, key, args, writer, model_folder, reader_cache: Path) -> None:
    schemas = {n: strict(n) for n in ATTACKS}
    receipts = {n: precompiled(writer, s) for n, s in schemas.items()}
    loose = precompiled(writer, PERMISSIVE)
    everything = [PREFIX + r["cache_key"] for r in [*receipts.values(), loose]]
    assert wait_for(lambda: all(client.exists(k) for k in everything), 30)  # published behind

    def genuine(receipt: dict) -> tuple[bytes, bytes]:
        frame = client.get(PREFIX + receipt["cache_key"])
        return frame, unseal(key, "entry:" + receipt["cache_key"], frame)

    def disk_file(n: str) -> Path:
        k, fp = receipts[n]["cache_key"], receipts[n]["tokenizer"]
        return reader_cache / "constraints" / f"v{STORE_VERSION}" / fp[:16] / k[:2] / (k + SUFFIX)

    permissive = genuine(loose)[1]
    originals = {n: genuine(r) for n, r in receipts.items()}
    for n, (tier, _) in ATTACKS.items():
        redis_key = PREFIX + receipts[n]["cache_key"]
        data = attack(n, *originals[n], permissive, "entry:" + receipts[n]["cache_key"])
        if tier == "redis":
            client.set(redis_key, data)
        else:  # on the reader's disk, and not in Redis: compiled again
            disk_file(n).parent.mkdir(parents=True, exist_ok=True)
            disk_file(n).write_bytes(data)
            client.delete(redis_key)

    reader = start_server(model_folder, reader_cache, args)
    try:
        for n, schema in schemas.items():
            r = post(reader, {"model": reader.model, "max_tokens": 40, "temperature": 0,
                              "messages": [{"role": "user", "content": "Is water wet? JSON."}],
                              "response_format": _format(schema)})  # fmt: skip
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["corral"]["cache"] == "compiled", n
            assert body["corral"]["cache_key"] == receipts[n]["cache_key"]
            choice = body["choices"][0]
            assert choice["finish_reason"] in ("stop", "length")  # length: closed by budget
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        for tier, reason in ATTACKS.values():
            assert metric(reader, REJECTED, f'tier="{tier}",reason="{reason}"') == 1
        assert metric(reader, REJECTED, 'tier="disk",reason="wrong_key"') == 0
        assert metric(reader, "corral_constraint_compiles_total", 'source="compiled"') == 5

        def resealed() -> bool:  # in Redis and on the reader's disk: the genuine entries
            for n in ATTACKS:
                frames = [client.get(PREFIX + receipts[n]["cache_key"])]
                frames.append(disk_file(n).read_bytes() if disk_file(n).exists() else None)
                if None in frames:
                    return False
                for frame in frames:
                    try:
                        entry = unseal(key, "entry:" + receipts[n]["cache_key"], frame)
                    except Rejected:  # not written yet: the rejected entry was deleted first
                        return False
                    if entry != originals[n][1]:
                        return False
            return True

        assert wait_for(resealed, 30)
    finally:
        stop_server(reader)
    log = reader.log.read_text()
    for tier, reason in ATTACKS.values():
        assert log.count(f"rejected a {tier} entry ({reason}:") == 1
    assert "Traceback" not in log


def test_the_redis_tier_refuses_to_start_without_a_key(tmp_path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env = clean | {"CORRAL_CACHE_URL": "redis://127.0.0.1:1/0", "CORRAL_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "corral.cli", "serve"], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    why = done.stderr.strip()
    assert why.startswith("corral serve: --cache-url needs --cache-key-file PATH")
    assert "$CORRAL_CACHE_KEY_FILE" in why and "openssl rand -hex 32" in why


def serve_refuses(monkeypatch, *args: str, env: dict[str, str] | None = None) -> str:
    """`corral serve ARGS` (this process, as the command runs it): the message it exits with,
    before anything is loaded."""
    from corral.cli import main

    for name in [k for k in os.environ if k.startswith("CORRAL_")]:
        monkeypatch.delenv(name)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:
        main(["serve", *args])
    return str(e.value.code)


def test_a_key_file_that_cannot_be_used_stops_the_start_and_says_why(tmp_path, monkeypatch):
    url = ("--cache-url", "redis://127.0.0.1:1/0")  # never reached: the key is checked first
    missing = tmp_path / "missing.key"
    why = serve_refuses(monkeypatch, *url, "--cache-key-file", str(missing))
    assert why == (
        f"corral serve: cache key file {missing} does not exist; create one with: "
        f"(umask 077; openssl rand -hex 32 > {missing})"
    )
    too_open = key_file(tmp_path / "open.key")
    too_open.chmod(0o644)
    why = serve_refuses(monkeypatch, env={"CORRAL_CACHE_KEY_FILE": str(too_open)})
    assert "mode 0644" in why and why.endswith(f"run chmod 600 {too_open}")
    short = tmp_path / "short.key"
    short.write_bytes(b"secret\n")
    short.chmod(0o600)
    why = serve_refuses(monkeypatch, *url, "--cache-key-file", str(short))
    assert "holds 6 bytes; a key needs at least 32" in why
    why = serve_refuses(monkeypatch, "--cache-key-file", str(tmp_path))  # without Redis too
    assert why == f"corral serve: cache key file {tmp_path} is not a regular file"
