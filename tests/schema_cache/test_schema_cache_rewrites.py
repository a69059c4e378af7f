"""The analysis's keyword rewrites travel with the compiled constraint: a compile in a worker
process, the memory LRU, the disk store and Redis all give back the records the compile made,
and an entry whose records are garbled is a miss, never served."""

from __future__ import annotations

import json
import struct

import pytest
from schema_cache_helpers import entry_files, opened_entry, sealed_entry

from corral.grammar import CompiledConstraint, ConstraintSpec, CorruptEntry
from corral.grammar.core.compiled import _seal
from corral.grammar.schema.rewrite_log import ONE_OF_DISJOINT, PATTERN_NARROWED, Rewritten

SCHEMA = {
    "type": "object",
    "properties": {
        "v": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
        "code": {"type": "string", "pattern": r"^\d{2}$"},
    },
    "required": ["v", "code"],
    "additionalProperties": False,
}
EXPECTED = (
    Rewritten("/properties/v/oneOf", "oneOf", ONE_OF_DISJOINT),
    Rewritten("/properties/code/pattern", "pattern", PATTERN_NARROWED),
)


def test_rewrites_are_the_same_from_a_worker_memory_disk_and_redis(
    make_service, redis, redis_server, tmp_path, key_file
):
    spec = ConstraintSpec.json_schema(SCHEMA)
    writer = make_service(isolation="process", redis_url=redis_server.url)
    first = writer.lookup(spec)
    assert first.source == "compiled" and first.compiled.rewrites == EXPECTED
    again = writer.lookup(spec)
    assert again.source == "memory" and again.compiled.rewrites == EXPECTED
    assert writer.flush(timeout=30)

    from_disk = make_service(key_file=key_file).lookup(spec)  # the key it was sealed under
    assert from_disk.source == "disk" and from_disk.compiled.rewrites == EXPECTED
    replica = make_service(root=tmp_path / "replica", redis_url=redis_server.url)
    from_redis = replica.lookup(spec)
    assert from_redis.source == "redis" and from_redis.compiled.rewrites == EXPECTED


def resealed(data: bytes, **changes: object) -> bytes:
    """An entry with fields of its JSON header changed and sealed again, as a buggy writer of
    the same format would leave it: only the changed fields are wrong."""
    start = len(b"CORRALCC") + 4
    (n,) = struct.unpack_from("<I", data, start - 4)
    header, payload = json.loads(data[start : start + n]), data[start + n :]
    header.update(changes)
    header["seal"] = _seal(header, payload)
    new = json.dumps(header).encode()
    return data[: start - 4] + struct.pack("<I", len(new)) + new + payload


def test_garbled_rewrite_records_are_a_miss(make_service, cache_root, llama3_tokenizer):
    spec = ConstraintSpec.json_schema(SCHEMA)
    writer = make_service()
    writer.lookup(spec)
    assert writer.flush(timeout=30)
    [path] = entry_files(cache_root)
    good = opened_entry(writer, spec, path.read_bytes())
    for bad in ([["/x", "oneOf"]], [[1, 2, 3]], "oneOf", [None]):
        entry = resealed(good, rewrites=bad)
        with pytest.raises(CorruptEntry, match="garbled header records"):
            CompiledConstraint.from_bytes(entry, llama3_tokenizer)
        path.write_bytes(sealed_entry(writer, spec, entry))  # sealed under the key, yet wrong
        service = make_service()
        found = service.lookup(spec)
        assert found.source == "compiled" and found.compiled.rewrites == EXPECTED
        assert service.stats()["rejected_entries"]["disk/invalid"] == 1
