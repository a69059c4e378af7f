"""Sealed entries: what the disk and Redis tiers hold carries an HMAC under the operator's key.

A forged permissive grammar and a flipped header, written straight into the cache folder and
straight into a real redis-server as someone without the key could write them, are never
served: each is a miss, counted by tier and reason, logged once, recompiled and sealed again.
Also: the seal's own reasons (wrong key, truncated, no MAC), the constraint published beside an
entry, the key file's errors, and the key generated in the cache folder."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys

import pytest
from schema_cache_helpers import (
    entry_files,
    forge,
    opened_entry,
    reframe,
    sealed_entry,
    wait_until,
    write_key_file,
)

from corral.grammar import CompiledConstraint, ConstraintSpec
from corral.grammar.core.compiler import compile_constraint
from corral.schema_cache import CacheConfig, CompileService, entry_key
from corral.schema_cache.prefetch import spec_bytes
from corral.schema_cache.redis_store import ANNOUNCE, PREFIX, SPEC_PREFIX
from corral.schema_cache.sealing import (
    KEY_FILE_NAME,
    KeyFileError,
    Rejected,
    SealKey,
    folder_key,
    read_key_file,
    seal,
    unseal,
)

STRICT = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
PERMISSIVE = {"type": "object"}
VALID = '{"name":"ab","n":1}'
INVALID = '{"x":[true,"anything"]}'  # an object, not an instance of STRICT


def takes(compiled: CompiledConstraint, tok, text: str) -> bool:
    ids = tok.encode(text)
    m = compiled.matcher()
    return m.accept_tokens(ids) == len(ids) and m.can_terminate()


def strict_and_forgery(tok) -> tuple[ConstraintSpec, bytes, bytes]:
    """STRICT's spec, its genuine entry, and a permissive grammar forged under its digest that
    the entry checks alone (checksum, digest, tokenizer) accept: served before sealing."""
    strict = ConstraintSpec.json_schema(STRICT)
    genuine = compile_constraint(strict, tok).to_bytes()
    permissive = compile_constraint(ConstraintSpec.json_schema(PERMISSIVE), tok).to_bytes()
    forged = forge(permissive, spec_digest=strict.digest)
    loaded = CompiledConstraint.from_bytes(forged, tok, spec_digest=strict.digest)
    assert takes(loaded, tok, INVALID)  # the forgery passes every check but the seal
    return strict, genuine, forged


def disk_path(service: CompileService, spec: ConstraintSpec) -> str:
    fp = service.tok.fingerprint
    return service.disk.path_for(entry_key(spec.digest, fp), fp)


def rejected(service: CompileService, where: str) -> int:
    return service.stats()["rejected_entries"][where]


def assert_strict_served_and_resealed(service, spec, data_now: bytes, genuine: bytes) -> None:
    """The lookup compiled ``spec`` again; what is stored now is its genuine entry, sealed."""
    found = service.lookup(spec)
    assert found.source == "compiled"
    tok = service.tok
    assert takes(found.compiled, tok, VALID) and not takes(found.compiled, tok, INVALID)
    assert service.flush(timeout=30)
    entry = opened_entry(service, spec, data_now())
    assert entry == genuine
    again = CompiledConstraint.from_bytes(entry, tok, spec_digest=spec.digest)
    assert not takes(again, tok, INVALID)


# -- the seal itself -----------------------------------------------------------------------------


def test_every_way_a_frame_can_be_wrong_has_its_reason() -> None:
    key, other = SealKey(b"k" * 32, "test"), SealKey(b"o" * 32, "test")
    entry = b"CORRALCC" + b"\x00" * 40 + b"payload"
    frame = seal(key, "entry:abc", entry)
    assert unseal(key, "entry:abc", frame) == entry
    cases = {
        "unsealed": entry,
        "truncated": frame[:-1],
        "malformed": frame + b"x",
        "wrong_key": seal(other, "entry:abc", entry),
        "bad_mac": reframe(frame, entry.replace(b"payload", b"PAYLOAD")),
    }
    for reason, data in cases.items():
        with pytest.raises(Rejected) as e:
            unseal(key, "entry:abc", data)
        assert e.value.reason == reason
    for cut in (0, 8, 20, 56):  # inside the frame's own fields
        with pytest.raises(Rejected, match="truncated|unsealed"):
            unseal(key, "entry:abc", frame[:cut])
    with pytest.raises(Rejected, match="bad_mac"):  # moved to another address
        unseal(key, "entry:abd", frame)
    with pytest.raises(Rejected, match="bad_mac"):  # every byte of the frame counts
        unseal(key, "entry:abc", frame[:-1] + bytes([frame[-1] ^ 1]))
    version = bytearray(frame)
    version[8] = 2
    with pytest.raises(Rejected, match="malformed"):
        unseal(key, "entry:abc", bytes(version))


# -- forged entries on disk and in Redis ------------------------------------------------------------


def test_a_forged_permissive_grammar_on_disk_is_never_served(make_service, cache_root, caplog):
    caplog.set_level(logging.WARNING, logger="corral.schema_cache.sealing")
    writer = make_service()
    strict, genuine, forged = strict_and_forgery(writer.tok)
    path = disk_path(writer, strict)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    attempts = {
        "unsealed": forged,  # written as an entry was before sealing
        "bad_mac": reframe(sealed_entry(writer, strict, genuine), forged),  # a real frame reused
    }
    for reason, data in attempts.items():
        with open(path, "wb") as f:
            f.write(data)
        service = make_service()  # a fresh process's view: nothing in memory
        assert_strict_served_and_resealed(service, strict, lambda: open(path, "rb").read(), genuine)
        assert rejected(service, f"disk/{reason}") == 1
        assert service.stats()["corrupt_entries"] == 1 and service.stats()["hits_disk"] == 0
    assert make_service().lookup(strict).source == "disk"  # the resealed entry is a hit
    warnings = [r.getMessage() for r in caplog.records if r.name.endswith(".sealing")]
    assert len(warnings) == 2 and all("rejected a disk entry" in w for w in warnings)


def test_a_flipped_header_on_disk_is_never_served(make_service, cache_root):
    writer = make_service()
    strict, genuine, _ = strict_and_forgery(writer.tok)
    path = disk_path(writer, strict)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    frame = sealed_entry(writer, strict, genuine)
    flips = (
        {"distinct_keys": True},
        {"unenforced": [["/properties/name", "maxLength", "not enforced"]]},
        {"limits": {"lexer_max_tokens": 1 << 30}},
    )
    for flip in flips:
        flipped = forge(genuine, **flip)
        for data, reason in ((flipped, "unsealed"), (reframe(frame, flipped), "bad_mac")):
            with open(path, "wb") as f:
                f.write(data)
            service = make_service()
            read = lambda: open(path, "rb").read()  # noqa: E731
            assert_strict_served_and_resealed(service, strict, read, genuine)
            assert rejected(service, f"disk/{reason}") == 1


def test_one_warning_per_tier_and_reason_however_many_rejections(make_service, caplog):
    caplog.set_level(logging.WARNING, logger="corral.schema_cache.sealing")
    service = make_service()
    specs_ = [ConstraintSpec.regex(rf"once{i}-[a-z]+") for i in range(4)]
    for spec in specs_:
        compiled = compile_constraint(spec, service.tok)
        path = disk_path(service, spec)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(compiled.to_bytes())  # no MAC
    assert [service.lookup(s).source for s in specs_] == ["compiled"] * 4
    assert rejected(service, "disk/unsealed") == 4
    [warning] = [r.getMessage() for r in caplog.records if r.name.endswith(".sealing")]
    assert "unsealed" in warning and "only counted" in warning


def test_an_entry_sealed_under_another_key_is_a_miss(make_service, tmp_path):
    spec = ConstraintSpec.regex(r"key-[a-z]+\d")
    theirs = make_service(root=tmp_path / "theirs")  # its own generated key
    theirs.get_or_compile(spec)
    assert theirs.flush(timeout=30)
    [their_file] = entry_files(tmp_path / "theirs")
    mine = make_service()
    path = disk_path(mine, spec)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(their_file.read_bytes())
    assert mine.lookup(spec).source == "compiled"
    assert rejected(mine, "disk/wrong_key") == 1


def test_a_truncated_entry_is_a_miss(make_service, cache_root):
    spec = ConstraintSpec.regex(r"cut-[a-z]+\d")
    writer = make_service()
    writer.get_or_compile(spec)
    assert writer.flush(timeout=30)
    [path] = entry_files(cache_root)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    service = make_service()
    assert service.lookup(spec).source == "compiled"
    assert rejected(service, "disk/truncated") == 1


def test_a_forged_grammar_and_a_flipped_header_in_redis_are_never_served(
    redis, redis_server, make_service, tmp_path
):
    writer = make_service(root=tmp_path / "writer", redis_url=redis_server.url)
    strict, genuine, forged = strict_and_forgery(writer.tok)
    key = PREFIX + entry_key(strict.digest, writer.tok.fingerprint)
    frame = sealed_entry(writer, strict, genuine)
    attempts = [
        (forged, "unsealed"),
        (reframe(frame, forged), "bad_mac"),
        (forge(genuine, distinct_keys=True), "unsealed"),
        (reframe(frame, forge(genuine, unenforced=[["/", "maxLength", "x"]])), "bad_mac"),
        (frame[:100], "truncated"),
    ]
    for i, (data, reason) in enumerate(attempts):
        redis.set(key, data)
        # a replica with an empty disk: Redis is where it looks
        service = make_service(root=tmp_path / f"replica{i}", redis_url=redis_server.url)
        assert_strict_served_and_resealed(service, strict, lambda: redis.get(key), genuine)
        assert rejected(service, f"redis/{reason}") == 1
        assert service.stats()["hits_redis"] == 0
    late = make_service(root=tmp_path / "late", redis_url=redis_server.url)
    assert late.lookup(strict).source == "redis"  # what was sealed again is a hit


def test_a_forged_constraint_beside_a_genuine_entry_is_not_prepared(
    redis, redis_server, make_service, tmp_path, llama3_tokenizer, key_file
):
    """Prefetch prepares what the publisher published beside an entry (schema forms map a
    schema's text to a spec): forged, it could map a strict schema to a permissive spec."""
    prepared: list = []
    config = CacheConfig(
        root=tmp_path / "here", redis_url=redis_server.url, isolation="thread", key_file=key_file
    )
    permissive = ConstraintSpec.json_schema(PERMISSIVE)
    publisher = make_service(root=tmp_path / "publisher", redis_url=redis_server.url)
    publisher.get_or_compile(permissive)  # a genuine, sealed entry
    assert publisher.flush(timeout=30)
    key = entry_key(permissive.digest, publisher.tok.fingerprint)
    lie = {"forms": [["f" * 64, True, True, False, False, [1, 1, [], 0, 0]]]}
    redis.set(SPEC_PREFIX + key, spec_bytes(permissive, lie))  # no MAC
    with CompileService(llama3_tokenizer, config, prepare=lambda s, e: prepared.append(e)) as here:
        wait_until(lambda: redis.pubsub_numsub(ANNOUNCE)[0][1] == 2, 10, "both to listen")
        redis.publish(ANNOUNCE, f"{key} {permissive.digest} someone")
        wait_until(lambda: here.stats()["prefetched"] == 1, 30, "the entry to load")
        assert prepared == []
        assert rejected(here, "redis/unsealed") == 1
        # published sealed, it is prepared
        redis.set(SPEC_PREFIX + key, publisher.sealer.seal_spec(key, spec_bytes(permissive, lie)))
        here.memory.clear()
        redis.publish(ANNOUNCE, f"{key} {permissive.digest} someone")
        wait_until(lambda: here.stats()["prefetched"] == 2, 30, "the entry to load again")
        assert prepared == [lie]


# -- keys ---------------------------------------------------------------------------------------


def test_the_redis_tier_needs_a_key_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="key_file"):
        CacheConfig(root=tmp_path, redis_url="redis://127.0.0.1:1/0")


def test_key_file_errors_say_what_is_wrong_and_what_to_do(tmp_path, llama3_tokenizer) -> None:
    missing = tmp_path / "nope.key"
    with pytest.raises(KeyFileError, match=r"nope\.key does not exist.*openssl rand"):
        read_key_file(missing)
    with pytest.raises(KeyFileError, match="does not exist"):  # at the service's start too
        CompileService(llama3_tokenizer, CacheConfig(root=tmp_path / "c", key_file=missing))
    open_key = write_key_file(tmp_path / "open.key")
    for mode in (0o644, 0o604, 0o620, 0o666):
        open_key.chmod(mode)
        with pytest.raises(KeyFileError, match=f"mode {mode:04o}.*chmod 600"):
            read_key_file(open_key)
    open_key.chmod(0o640)  # a group that may read it (a secret mounted for a group) will do
    assert len(read_key_file(open_key).secret) == 64
    short = write_key_file(tmp_path / "short.key", b"0123456789abcdef\n")
    with pytest.raises(KeyFileError, match="holds 16 bytes.*at least 32"):
        read_key_file(short)
    with pytest.raises(KeyFileError, match="not a regular file"):
        read_key_file(tmp_path)
    spaced = write_key_file(tmp_path / "spaced.key", b"  " + b"s" * 32 + b"\n\n")
    assert read_key_file(spaced).secret == b"s" * 32
    if os.geteuid() != 0:  # root reads anything
        unreadable = write_key_file(tmp_path / "locked.key")
        unreadable.chmod(0)
        with pytest.raises(KeyFileError, match="cannot be read"):
            read_key_file(unreadable)


GENERATE = """
import sys
from corral.schema_cache.sealing import folder_key
print(folder_key(sys.argv[1]).secret.decode())
"""


def test_the_generated_key_is_private_and_one_for_every_process(tmp_path) -> None:
    root = tmp_path / "constraints"
    racers = [
        subprocess.Popen([sys.executable, "-c", GENERATE, str(root)], stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    keys = {p.communicate(timeout=60)[0].strip() for p in racers}
    assert all(p.returncode == 0 for p in racers)
    assert len(keys) == 1  # whoever linked first won; the others read theirs
    path = root / KEY_FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert folder_key(root).secret == keys.pop() and len(path.read_bytes().strip()) == 64
    assert sorted(p.name for p in root.iterdir()) == [KEY_FILE_NAME]  # no temporary files left
    path.chmod(0o644)  # someone opened it up: not used, and the service says why
    with pytest.raises(KeyFileError, match="chmod 600"):
        folder_key(root)


def test_without_a_usable_key_the_disk_store_is_off_and_requests_are_served(
    make_service, cache_root, caplog
):
    caplog.set_level(logging.WARNING, logger="corral.schema_cache.service")
    cache_root.mkdir(parents=True)
    (cache_root / KEY_FILE_NAME).mkdir()  # neither readable as a key nor replaceable
    service = make_service()
    spec = ConstraintSpec.regex(r"nokey-[a-z]+")
    assert service.lookup(spec).source == "compiled"
    assert service.flush(timeout=30) and entry_files(cache_root) == []
    assert service.sealer is None and not service.disk.enabled
    assert any("disk store is off" in r.getMessage() for r in caplog.records)


def test_a_configured_key_file_seals_what_the_disk_holds(make_service, cache_root, key_file):
    spec = ConstraintSpec.regex(r"conf-[a-z]+")
    writer = make_service(key_file=key_file)
    writer.get_or_compile(spec)
    assert writer.flush(timeout=30)
    assert not (cache_root / KEY_FILE_NAME).exists()  # nothing generated
    assert make_service(key_file=key_file).lookup(spec).source == "disk"
    other = make_service()  # the folder's generated key: another key
    assert other.lookup(spec).source == "compiled"
    assert rejected(other, "disk/wrong_key") == 1
    assert json.loads(json.dumps(other.stats()["rejected_entries"]))  # plain JSON for the CLI
