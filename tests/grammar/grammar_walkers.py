"""Fast, steerable random walks for the grammar tests (a helper module, not a test file).

``corral.grammar.core.walk.random_walk`` is the shared, plain walk: uniform over the allowed tokens.
Over a 128k vocabulary it spends ~40-80 ms a step listing the allowed ids, and inside a JSON
string the closing quote is one token in tens of thousands, so uniform walks rarely finish an
object. The walk here lists the ids with numpy (under a millisecond) and, with probability
``steer``, draws from the allowed tokens that close something (``"`` ``}`` ``]`` ...) or are one
byte long. It stays honest: the draw is always among the tokens the mask allows, the uniform
branch can pick any of them, and the matcher must accept whatever is picked.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jsonschema import Draft202012Validator, validators

from corral.grammar import Matcher, TokenizerInfo

JSON_CLOSERS = b'"}]'


def allowed_ids(bitmask: torch.Tensor, row: int, vocab_size: int) -> np.ndarray:
    """Ids that ``bitmask[row]`` allows (bit i of word j allows 32j+i), computed with numpy."""
    words = bitmask[row].numpy().astype("<i4", copy=False)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


@dataclass(frozen=True, eq=False)
class TokenTable:
    """Per-token facts the steering policy uses: which tokens close a structure, which are short."""

    vocab_size: int
    eos: frozenset[int]
    closes: np.ndarray  # bool[vocab_size]
    short: np.ndarray  # bool[vocab_size]

    @classmethod
    def cached(cls, tok: TokenizerInfo, closers: bytes = JSON_CLOSERS) -> TokenTable:
        """The table for ``tok`` where tokens containing any byte of ``closers`` close things.
        The per-token bytes are read once per tokenizer for the whole session."""
        pieces = _pieces(tok)
        closes = np.zeros(tok.vocab_size, dtype=bool)
        for c in set(closers):
            closes |= pieces.containing(c)
        return cls(tok.vocab_size, frozenset(tok.eos_token_ids), closes, pieces.short)


class _Pieces:
    """The bytes of every token of one tokenizer, and which tokens contain a given byte."""

    def __init__(self, tok: TokenizerInfo) -> None:
        ll = tok.llguidance
        self.size = tok.vocab_size
        self.bytes = [ll.decode_bytes([i]) for i in range(tok.tokenizer_vocab_size)]
        self.short = np.zeros(self.size, dtype=bool)
        self.short[: len(self.bytes)] = [len(b) == 1 for b in self.bytes]
        self._containing: dict[int, np.ndarray] = {}

    def containing(self, byte: int) -> np.ndarray:
        if byte not in self._containing:
            found = np.zeros(self.size, dtype=bool)
            found[: len(self.bytes)] = [byte in b for b in self.bytes]
            self._containing[byte] = found
        return self._containing[byte]


_PIECES: dict[str, _Pieces] = {}


def _pieces(tok: TokenizerInfo) -> _Pieces:
    if tok.fingerprint not in _PIECES:
        _PIECES[tok.fingerprint] = _Pieces(tok)
    return _PIECES[tok.fingerprint]


@dataclass
class Walk:
    """A finished or abandoned walk: tokens (without the final EOS) and what was seen on the way."""

    tokens: list[int] = field(default_factory=list)
    terminated: bool = False
    #: forced[i] is ``forced_continuation()`` just before tokens[i] (or the EOS) was picked.
    forced: list[bytes] = field(default_factory=list)


def steered_walk(
    m: Matcher,
    table: TokenTable,
    rng: random.Random,
    *,
    max_tokens: int = 300,
    end_bias: float = 0.5,
    steer: float = 0.6,
) -> Walk:
    """Pick allowed tokens until the matcher terminates or ``max_tokens`` pass (terminated False).

    Once EOS is allowed it is taken with probability ``end_bias``. Otherwise, with probability
    ``steer`` the pick is among allowed closing tokens (half the time) or allowed one-byte tokens
    when there are any; else uniform over all allowed non-EOS tokens.
    """
    bitmask = torch.zeros((1, (table.vocab_size + 31) // 32), dtype=torch.int32)
    walk = Walk()
    for _ in range(max_tokens):
        if m.is_terminated():
            walk.terminated = True
            return walk
        walk.forced.append(m.forced_continuation())
        m.fill_mask(bitmask, 0)
        ids = allowed_ids(bitmask, 0, table.vocab_size)
        assert ids.size, "the matcher allows no token but has not terminated"
        ends = [t for t in sorted(table.eos) if has_id(ids, t)]
        if ends and (rng.random() < end_bias or len(ends) == ids.size):
            assert m.accept(rng.choice(ends)), "the matcher refused an EOS its mask allowed"
            walk.terminated = True
            return walk
        token = pick_token(ids, table, rng, steer)
        assert m.accept(token), f"the matcher refused token {token} that its own mask allowed"
        walk.tokens.append(token)
    walk.forced = walk.forced[: len(walk.tokens)]
    return walk


def has_id(ids: np.ndarray, t: int) -> bool:
    i = int(np.searchsorted(ids, t))
    return i < ids.size and int(ids[i]) == t


def pick_token(ids: np.ndarray, table: TokenTable, rng: random.Random, steer: float) -> int:
    ids = ids[~np.isin(ids, list(table.eos))]
    r = rng.random()
    if r < steer:
        prefer = table.closes[ids] if r < steer / 2 else table.short[ids]
        chosen = ids[prefer]
        if chosen.size:
            return int(chosen[rng.randrange(chosen.size)])
    return int(ids[rng.randrange(ids.size)])


def decode(tok: TokenizerInfo, ids: list[int]) -> str:
    """The text of ``ids`` as the HF tokenizer decodes it (no clean-up, special tokens kept)."""
    return tok.hf_tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False)


def token_bytes(tok: TokenizerInfo, ids: list[int]) -> bytes:
    return b"".join(tok.llguidance.decode_bytes([t]) for t in ids)


def check_forced(walk: Walk, tok: TokenizerInfo) -> None:
    """Each forced continuation is a prefix of the bytes the walk produced from there on (or,
    for an abandoned walk, those bytes are a prefix of it)."""
    pieces = [tok.llguidance.decode_bytes([t]) for t in walk.tokens]
    for i, forced in enumerate(walk.forced):
        rest = b"".join(pieces[i:])
        ok = rest.startswith(forced) or (not walk.terminated and forced.startswith(rest))
        assert ok, f"step {i}: forced {forced!r} but the walk went on with {rest[:80]!r}"


def byte_tokenizer() -> TokenizerInfo:
    """A 257-token byte-level tokenizer (256 bytes + ``<eos>``) built in memory, no downloads:
    a second, unrelated vocabulary for tests that need one."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in byte_chars().items()}
    vocab["<eos>"] = 256
    tk = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([tokenizers.AddedToken("<eos>", special=True)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")
    return TokenizerInfo.from_hf(hf)


def byte_chars() -> dict[int, str]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the rest are moved
    past U+0100 in byte order (the convention GPT-2-style tokenizer.json files use)."""
    keep = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    out, moved = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + moved)
            moved += 1
    return out


def no_repeats(pairs: list) -> dict:
    """A ``json.loads`` object hook that fails on a key repeated within one object."""
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"repeated key in {keys}"
    return dict(pairs)


def assert_walks_valid_without_repeats(
    matcher: Callable[[], Matcher], schema: dict, tok: TokenizerInfo, walks: int, max_tokens: int
) -> None:
    """``walks`` steered walks (seed 16) of fresh matchers: every finished one is an instance of
    ``schema`` (jsonschema in the dialect ``$schema`` names, with formats) that repeats no key,
    and at least 4 finish."""
    table = TokenTable.cached(tok)
    dialect = validators.validator_for(schema, default=Draft202012Validator)
    judge = dialect(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    rng = random.Random(16)
    done = 0
    for _ in range(walks):
        w = steered_walk(matcher(), table, rng, max_tokens=max_tokens, end_bias=0.6, steer=0.7)
        if not w.terminated:
            continue
        done += 1
        check_forced(w, tok)
        instance = json.loads(decode(tok, w.tokens), object_pairs_hook=no_repeats)
        assert judge.is_valid(instance), (decode(tok, w.tokens), schema)
    assert done >= 4


def assert_closings_valid(
    schema: dict, compiled: Any, text: str, tok: TokenizerInfo, *, always: bool = False
) -> int:
    """Feed ``text`` to the schema's budget closer one character at a time: every closing it
    finds completes the text into an instance of ``schema`` (jsonschema) that ``compiled``'s
    matcher accepts. ``always``: a closing must be found after every character. Returns how
    many closings were found."""
    from corral.grammar import ConstraintSpec
    from corral.grammar.closing.partial_json import PartialJson
    from corral.grammar.closing.shortest import JsonCloser
    from corral.grammar.core.walk import accepts

    judge = Draft202012Validator(schema)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    partial, found_n = PartialJson.empty(JsonCloser.for_spec(ConstraintSpec.json_schema(schema))), 0
    for i, ch in enumerate(text):
        partial.feed(ch)
        found = partial.closing()
        assert found is not None or not always, text[: i + 1]
        if found is None:
            continue
        full = text[: i + 1] + found[0]
        assert judge.is_valid(json.loads(full)), full
        assert accepts(compiled.matcher(), tok.encode(full), bitmask), full
        found_n += 1
    return found_n


def merged_properties(where: str, holder_first: bool) -> dict:
    """An object whose properties come from itself and from ``where``, its own `properties`
    written before or after that keyword."""
    own = {"ast": {"enum": ["B", "S"]}, "type": {"enum": ["R", "W"]}}
    branch = {"properties": {"type": {"const": "R"}, "data": {"type": "integer"}}}
    merged: dict = {
        "anyOf": {"anyOf": [branch, {"properties": {"type": {"const": "W"}}}]},
        "allOf": {"allOf": [branch]},
        "$ref": {"$ref": "#/$defs/branch"},
    }[where]
    parts = [{"properties": own}, merged] if holder_first else [merged, {"properties": own}]
    schema = {"type": "object", "required": ["ast", "type"], **parts[0], **parts[1]}
    return {"$defs": {"branch": branch}, **schema} if where == "$ref" else schema
