"""CompiledConstraint bytes: a round trip gives a matcher with the same masks, and anything
truncated, garbled or built for another tokenizer is a CorruptEntry, never another exception."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import struct

import pytest
import torch
from grammar_walkers import TokenTable, byte_tokenizer, steered_walk

from corral.grammar import (
    CompiledConstraint,
    ConstraintSpec,
    CorruptEntry,
    TokenizerInfo,
    compile_constraint,
)

SPECS = {
    "json": ConstraintSpec.json_schema(
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "maxItems": 2}},
            "required": ["id"],
        }
    ),
    "json-lenient": ConstraintSpec.json_schema(
        {"type": "array", "items": {"type": "integer", "maximum": 999}, "uniqueItems": True},
        strict=False,
    ),
    "regex": ConstraintSpec.regex(r"[A-Z]{2}-\d{3,5}"),
    "choice": ConstraintSpec.choice(["red", "green", "blue"]),
    "lark": ConstraintSpec.lark('start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]+/'),
    # llguidance's GBNF converter refuses the look-ahead, so this one is compiled by xgrammar.
    "ebnf-xgrammar": ConstraintSpec.ebnf('root ::= item ";"\nitem ::= [a-c]+ (= ";")'),
}


@pytest.fixture(scope="module")
def compiled(llama3_tokenizer):
    return {name: compile_constraint(spec, llama3_tokenizer) for name, spec in SPECS.items()}


def _masks_agree(a, b, tokens: list[int], tok: TokenizerInfo) -> None:
    """Feed the same tokens to two matchers; their masks must be identical at every step."""
    ma = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    mb = torch.zeros_like(ma)
    for i, t in enumerate(tokens):
        a.fill_mask(ma, 0)
        b.fill_mask(mb, 0)
        assert torch.equal(ma, mb), f"masks differ at step {i}"
        assert a.forced_continuation() == b.forced_continuation()
        assert a.can_terminate() == b.can_terminate()
        assert a.accept(t) and b.accept(t)
    assert a.is_terminated() == b.is_terminated()


@pytest.mark.parametrize("name", SPECS)
def test_round_trip_gives_a_matcher_with_the_same_masks(name, compiled, llama3_tokenizer):
    c = compiled[name]
    spec = SPECS[name]
    back = CompiledConstraint.from_bytes(c.to_bytes(), llama3_tokenizer, spec_digest=spec.digest)
    assert (back.backend, back.payload, back.spec_digest) == (c.backend, c.payload, spec.digest)
    assert back.unenforced == c.unenforced
    assert back.to_bytes() == c.to_bytes()
    table = TokenTable.cached(llama3_tokenizer)
    rng = random.Random(name)
    for _ in range(3):
        walk = steered_walk(c.matcher(), table, rng, max_tokens=60, end_bias=0.3)
        tokens = walk.tokens + ([llama3_tokenizer.eos_token_ids[0]] if walk.terminated else [])
        _masks_agree(c.matcher(), back.matcher(), tokens, llama3_tokenizer)


def test_backends_are_the_expected_ones(compiled):
    assert compiled["ebnf-xgrammar"].backend == "xgrammar"
    assert {c.backend for n, c in compiled.items() if n != "ebnf-xgrammar"} == {"llguidance"}
    assert compiled["json-lenient"].unenforced, "lenient mode must report uniqueItems"


def test_a_constraint_for_an_unknown_backend_cannot_be_built(compiled):
    """The backend name picks the loader and the matcher; an unknown one never falls through."""
    with pytest.raises(ValueError, match="outlines"):
        dataclasses.replace(compiled["json"], backend="outlines")


@pytest.mark.parametrize("name", ["json", "ebnf-xgrammar"])
def test_every_truncation_is_corrupt(name, compiled, llama3_tokenizer):
    data = compiled[name].to_bytes()
    cuts = sorted({*range(0, 80), *range(80, len(data), max(1, len(data) // 200)), len(data) - 1})
    for n in cuts:
        with pytest.raises(CorruptEntry):
            CompiledConstraint.from_bytes(data[:n], llama3_tokenizer)


def _header_span(data: bytes) -> tuple[int, int]:
    (n,) = struct.unpack_from("<I", data, 8)
    return 12, 12 + n


def _load_or_corrupt(data: bytes, tok: TokenizerInfo, good: CompiledConstraint, digest):
    """Loading must raise CorruptEntry or give back the stored constraint (with the digest the
    caller asked for, when it asked)."""
    try:
        back = CompiledConstraint.from_bytes(data, tok, spec_digest=digest)
    except CorruptEntry:
        return
    assert (back.backend, back.payload) == (good.backend, good.payload)
    assert back.spec_digest == (digest or back.spec_digest)
    assert back.unenforced == good.unenforced


@pytest.mark.parametrize("check_digest", [True, False], ids=["digest-checked", "unchecked"])
@pytest.mark.parametrize("name", ["json", "json-lenient"])
def test_every_garbled_header_byte_is_corrupt_or_harmless(
    name, check_digest, compiled, llama3_tokenizer
):
    """Flip bits in every header byte (the magic, the length, the JSON header): CorruptEntry,
    or -- where the flip is harmless, e.g. a space turned into a tab -- the same constraint."""
    good = compiled[name]
    data = good.to_bytes()
    digest = SPECS[name].digest if check_digest else None
    _, end = _header_span(data)
    for i in range(end):
        for flip in (0x01, 0x02, 0x20, 0x80):
            garbled = bytearray(data)
            garbled[i] ^= flip
            _load_or_corrupt(bytes(garbled), llama3_tokenizer, good, digest)


@pytest.mark.parametrize("name", ["json", "regex", "ebnf-xgrammar"])
def test_garbled_payload_is_corrupt(name, compiled, llama3_tokenizer):
    data = compiled[name].to_bytes()
    _, start = _header_span(data)
    rng = random.Random(name)
    for i in rng.sample(range(start, len(data)), min(40, len(data) - start)):
        garbled = bytearray(data)
        garbled[i] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptEntry):
            CompiledConstraint.from_bytes(bytes(garbled), llama3_tokenizer)


@pytest.mark.parametrize("name", ["json", "ebnf-xgrammar"])
def test_payload_with_a_matching_checksum_that_does_not_load_is_corrupt(
    name, compiled, llama3_tokenizer
):
    """A payload that is not a grammar (or not xgrammar's JSON) but whose checksum was made to
    match: the loader must still say CorruptEntry."""
    data = compiled[name].to_bytes()
    start, end = _header_span(data)
    header = json.loads(data[start:end])
    for payload in (b"", b"\xff\xfe not utf-8", b'{"grammars": 7}', b"root ::= ", b"[]"):
        header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
        raw = json.dumps(header).encode()
        forged = data[:8] + struct.pack("<I", len(raw)) + raw + payload
        with pytest.raises(CorruptEntry):
            CompiledConstraint.from_bytes(forged, llama3_tokenizer)


def test_random_bytes_are_corrupt(llama3_tokenizer):
    rng = random.Random(0)
    for n in (0, 3, 12, 100, 5000):
        with pytest.raises(CorruptEntry):
            CompiledConstraint.from_bytes(rng.randbytes(n), llama3_tokenizer)
    with pytest.raises(CorruptEntry):
        CompiledConstraint.from_bytes(b"CORRALCC" + struct.pack("<I", 2**32 - 1), llama3_tokenizer)


def test_another_constraints_entry_is_corrupt(compiled, llama3_tokenizer):
    data = compiled["json"].to_bytes()
    with pytest.raises(CorruptEntry):
        CompiledConstraint.from_bytes(data, llama3_tokenizer, spec_digest=SPECS["regex"].digest)


def _llama3_variant(tok: TokenizerInfo, **kw) -> TokenizerInfo:
    args = {"vocab_size": tok.vocab_size, "eos_token_ids": tok.eos_token_ids} | kw
    return TokenizerInfo.from_hf(tok.hf_tokenizer, **args)


@pytest.fixture(scope="module")
def other_tokenizers(llama3_tokenizer):
    others = [
        byte_tokenizer(),  # an unrelated vocabulary
        _llama3_variant(llama3_tokenizer, vocab_size=llama3_tokenizer.vocab_size + 64),
        _llama3_variant(llama3_tokenizer, eos_token_ids=[128009]),
    ]
    assert len({o.fingerprint for o in others} | {llama3_tokenizer.fingerprint}) == 4
    return others


@pytest.mark.parametrize("name", ["json", "regex", "ebnf-xgrammar"])
def test_entry_for_another_tokenizer_is_corrupt(name, compiled, other_tokenizers):
    data = compiled[name].to_bytes()
    for other in other_tokenizers:
        with pytest.raises(CorruptEntry):
            CompiledConstraint.from_bytes(data, other)


def test_entry_from_another_format_or_backend_version_is_corrupt(compiled, llama3_tokenizer):
    data = compiled["json"].to_bytes()
    start, end = _header_span(data)
    header = json.loads(data[start:end])
    for change in ({"format": 999}, {"backend": "outlines"}, {"backend_version": "0.0.0"}):
        raw = json.dumps(header | change).encode()
        forged = data[:8] + struct.pack("<I", len(raw)) + raw + data[end:]
        with pytest.raises(CorruptEntry):
            CompiledConstraint.from_bytes(forged, llama3_tokenizer)
