"""The constraint runtime (``grammar.core.runtime``) and the state it owns: per tokenizer, per
server, never shared through a module global; budget closers complete before they are shared
and correct when shared across threads; one table of token bytes, the grammar's exact bytes."""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from budget_schemas import AREA, TAGGED
from grammar_walkers import byte_chars, byte_tokenizer

from corral.api.tool_formats import FORMATS
from corral.api.tools import TOOL_JSON_FORMAT
from corral.grammar import ConstraintSpec, TokenizerInfo
from corral.grammar.checks.distinct_keys import token_index
from corral.grammar.closing.partial_json import PartialJson
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.closing.tags import PartialTag, TagCloser
from corral.grammar.core.runtime import BudgetClose, ConstraintRuntime, closes

RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z]{2,}[0-9]$"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "minItems": 1},
                "leaf": {"$ref": "#/$defs/node"},
            },
            "required": ["name"],
        }
    },
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"}, "id": {"type": "string", "format": "uuid"}},
    "required": ["root", "id"],
}
PATTERNS = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "tags": {
            "type": "array",
            "items": {"type": "string", "pattern": "^t[0-9]+$"},
            "uniqueItems": True,
            "minItems": 3,
        },
        "when": {"type": "string", "format": "date-time"},
    },
    "patternProperties": {"^x-[a-z]+$": {"type": "integer", "minimum": 3}},
    "required": ["code", "tags", "when"],
    "minProperties": 4,
}
#: (schema, instance texts whose every prefix gets a closing)
CASES = [
    (AREA, ['{"shape":"circle","dimensions":{"radius":2.5}}']),
    (TAGGED, ['[{"kind":"box","w":"ab"},{"kind":"circle","r":3}]']),
    (RECURSIVE, ['{"root":{"name":"ab1","children":[{"name":"cd2"}]},"id":"0"}']),
    (PATTERNS, ['{"code":"ABC-1234","tags":["t1","t22","t3"],"when":"2000","x-a":4}']),
]


def _work(closer: JsonCloser, texts: list[str]) -> list:
    """What budget closing asks a closer: the shortest instance, then a closing per prefix."""
    out: list = [closer.shortest(closer.root)]
    for text in texts:
        partial = PartialJson.empty(closer)
        for ch in text:
            partial.feed(ch)
            out.append(partial.closing())
    return out


@pytest.fixture
def fast_switching():
    """Threads switch as often as the interpreter allows, so the memos' races are met."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_a_closer_shared_by_threads_answers_as_one_thread_does(fast_switching):
    """Eight threads run the same closings on one fresh closer per schema at once (its memos,
    busy marks and pattern automata filled concurrently); each gets what one thread alone
    gets on a closer of its own."""
    for schema, texts in CASES:
        spec = ConstraintSpec.json_schema(schema)
        alone = _work(JsonCloser.for_spec(spec), texts)
        assert alone[0] is not None and any(c is not None for c in alone[1:])
        for _ in range(3):
            shared = JsonCloser.for_spec(spec)
            start = threading.Barrier(8)

            def run(shared=shared, start=start, texts=texts):
                start.wait()
                return _work(shared, texts)

            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda _: run(), range(8)))
            assert all(r == alone for r in results), json.dumps(schema)[:80]


def test_a_tag_closer_shared_by_threads_answers_as_one_thread_does(fast_switching):
    fmt = FORMATS["hermes"]
    tag = {
        "structures": [{"begin": b, "schema": AREA, "end": fmt.end} for b in fmt.begins("f")],
        "triggers": list(fmt.triggers),
        "at_least_one": True,
        "stop_after_first": False,
        "free_text": False,
        "separator": fmt.separator,
    }
    spec = ConstraintSpec.structural_tag_of(tag, json_format=TOOL_JSON_FORMAT)
    out = fmt.render_call("f", {"shape": "square", "dimensions": {"length": 2, "base": 3}})

    def work(closer: TagCloser) -> list:
        partial, found = closer.start(), []
        for ch in out:
            partial.feed(ch)
            found.append(partial.closing())
        return found

    alone = work(TagCloser.for_spec(spec))
    shared = TagCloser.for_spec(spec)
    with ThreadPoolExecutor(8) as pool:
        assert all(r == alone for r in pool.map(lambda _: work(shared), range(8)))


def test_a_runtime_keeps_one_closer_per_constraint_built_once(fast_switching):
    """Threads asking one runtime for the same constraint at once all get one object, complete
    (its shortest instance known); another runtime builds its own."""
    tok = byte_tokenizer()
    runtime, other = ConstraintRuntime(tok), ConstraintRuntime(tok)
    spec = ConstraintSpec.json_schema(RECURSIVE)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: runtime.budget_close(spec), range(16)))
    assert all(g is got[0] for g in got)
    closer = got[0].closer
    assert id(closer.root) in closer._memo  # complete before it was shared
    assert runtime.budget_close(spec) is got[0]
    assert other.budget_close(spec) is not got[0]
    assert other.budget_close(spec).closer is not closer


def test_two_runtimes_hold_their_own_tokenizers_and_closers(llama3_tokenizer):
    """Two servers' runtimes (two tokenizers) in one process: each closing reads its own
    tokenizer's bytes and fingerprint; a bound on one runtime's closers evicts only its own."""
    small = ConstraintRuntime(byte_tokenizer(), max_closers=1)
    large = ConstraintRuntime(llama3_tokenizer)
    first = ConstraintSpec.json_schema({"type": "object", "properties": {"é": {"const": "ü"}}})
    second = ConstraintSpec.json_schema({"type": "array", "items": {"type": "integer"}})
    kept = large.budget_close(first)
    evicted = small.budget_close(first)
    assert kept.tokenizer is llama3_tokenizer and evicted.tokenizer is small.tokenizer
    assert kept.tokenizer_fingerprint != evicted.tokenizer_fingerprint
    small.budget_close(second)
    assert small.budget_close(first) is not evicted  # one closer kept: rebuilt
    assert large.budget_close(first) is kept and large.stats() == {"budget_closers": 1}
    assert len(small.token_bytes) == 257 and len(large.token_bytes) == llama3_tokenizer.vocab_size
    for close in (kept, evicted):
        for byte in "é".encode():
            token = close.byte_token(byte)
            assert token is not None and close.token_bytes(token) == bytes([byte])


def test_what_has_no_budget_closing_gets_none():
    runtime = ConstraintRuntime(byte_tokenizer())
    assert runtime.budget_close(ConstraintSpec.regex("[a-z]+")) is None
    reasoned = ConstraintSpec.json_schema({"type": "integer"}).after_reasoning(
        "<think>", "</think>"
    )
    assert not closes(reasoned) and runtime.budget_close(reasoned) is None
    assert runtime.stats() == {"budget_closers": 0}


def test_a_structural_tag_closing_starts_a_tag_parser():
    """A tool-call constraint's budget closing parses the output as a structural tag (a JSON
    parser over a tag closer has no schema root)."""
    fmt = FORMATS["hermes"]
    tag = {
        "structures": [{"begin": b, "schema": AREA, "end": fmt.end} for b in fmt.begins("f")],
        "triggers": list(fmt.triggers),
        "at_least_one": True,
        "stop_after_first": False,
        "free_text": True,
        "separator": fmt.separator,
    }
    spec = ConstraintSpec.structural_tag_of(tag, json_format=TOOL_JSON_FORMAT)
    close = ConstraintRuntime(byte_tokenizer()).budget_close(spec)
    assert isinstance(close.closer, TagCloser) and isinstance(close.start(), PartialTag)
    json_close = BudgetClose.for_spec(ConstraintSpec.json_schema(AREA), byte_tokenizer())
    assert isinstance(json_close.start(), PartialJson)


def test_one_table_of_token_bytes_per_tokenizer(llama3_tokenizer):
    """The masks' scans and budget closing read the same table: llguidance's exact bytes."""
    tok = llama3_tokenizer
    assert token_index(tok).bytes is tok.token_bytes
    assert token_index(tok) is token_index(tok)
    lt = tok.llguidance
    for t in (0, 1, 220, 1131, 9906, 128000, 128009, tok.vocab_size - 1):
        assert tok.token_bytes[t] == lt.decode_bytes([t])


def test_token_bytes_agree_with_byte_level_pieces_and_are_exact_for_other_vocabularies():
    """Budget closing used to map a token's piece through GPT-2's byte alphabet (else decode
    the token alone). For a byte-level BPE vocabulary the grammar's table says the same; for a
    SentencePiece-style one (metaspace, byte fallback) that was wrong, and the table is exact:
    ``▁hi`` is " hi" (decoded alone it loses its space), ``<0xE9>`` is the byte 0xE9 (its
    piece is ASCII, read as the text "<0xE9>"), and the token of the byte 0xE9 is found."""
    base = byte_tokenizer()
    alphabet = {ch: b for b, ch in byte_chars().items()}
    for t in range(255):  # 0xFF, never in UTF-8 text, marks a special token for llguidance
        piece = base.hf_tokenizer.convert_ids_to_tokens(t)
        assert base.token_bytes[t] == bytes(alphabet[ch] for ch in piece)
    assert base.token_bytes[255] == b"" and base.llguidance.is_special_token(255)

    tok = _sentencepiece_tokenizer()
    hf = tok.hf_tokenizer
    hi, e9 = hf.convert_tokens_to_ids("\u2581hi"), hf.convert_tokens_to_ids("<0xE9>")
    assert hf.decode([hi]) == "hi" and all(ch in alphabet for ch in "<0xE9>")  # the old ways
    assert tok.token_bytes[hi] == b" hi" and tok.token_bytes[e9] == b"\xe9"
    close = BudgetClose.for_spec(ConstraintSpec.json_schema({"type": "string"}), tok)
    assert close.byte_token(0xE9) == e9 and close.token_bytes(e9) == b"\xe9"


def _sentencepiece_tokenizer() -> TokenizerInfo:
    """A tiny Llama-2-style vocabulary: metaspace, byte fallback, a few merges (no downloads)."""
    import tokenizers
    from tokenizers import decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for piece in ("\u2581", "h", "i", "\u2581h", "\u2581hi"):
        vocab[piece] = len(vocab)
    merges = [("\u2581", "h"), ("\u2581h", "i")]
    tk = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>")
    )
    tk.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tk.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tk.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in ("<s>", "</s>")])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    return TokenizerInfo.from_hf(hf)


def test_a_tokenizer_builds_what_is_derived_from_it_once(fast_switching):
    tok = byte_tokenizer()
    built = []

    def build(t: TokenizerInfo) -> object:
        built.append(t)
        return object()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: tok.derived(build), range(32)))
    assert len(built) == 1 and all(g is got[0] for g in got)
    assert byte_tokenizer().derived(build) is not got[0]  # another tokenizer: its own
