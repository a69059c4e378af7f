"""The compile-time probe: walk a copy of a fresh llguidance matcher over its first positions.

llguidance compiles some valid constraints whose matcher then fails at the first masks: an Earley
row past its item limit (an object with hundreds of optional properties, thousands of grammar
alternatives), the lexer out of fuel (``a{1000000}``), a schema with no valid instance (a
``$ref`` cycle). Such a constraint must be refused at compile time, not reach generation.

The probe computes the first mask and then walks up to ``PROBE_POSITIONS`` more positions, the
way a generation gets there: it takes the forced continuation when there is one (tokenized as
the engine drafts it; llguidance finds row and lexer limits when it consumes tokens), and
otherwise computes the mask and takes one allowed single-byte token, preferring those that close
or separate JSON structures (``"`` ``,`` ``}`` ``]``), so it reaches the next member's row soon.
It never takes EOS. It costs a typical schema about 0.5 ms (Llama-3's 128k vocabulary), and the
lexer states it builds are shared with every later copy of the prototype. Rows that only a
longer generation reaches are not seen: the engine handles those with ``Matcher.error()`` /
``recover()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from corral.grammar.backends.llg import try_consume
from corral.grammar.backends.llg_limits import classify, first_line
from corral.grammar.core.tokenizer import TokenizerInfo

#: Positions probed after the first (a forced run counts as one position). Every reproducer of
#: issue 11 fails at the first; a short free string before a large object needs two.
PROBE_POSITIONS = 4
#: How much of a forced continuation one probe step consumes.
PROBE_FORCED_BYTES = 256
#: Single bytes to take where nothing is forced, best first.
PREFERRED = b'",}]:0a'


@dataclass(frozen=True)
class ProbeFailure:
    """Why a fresh matcher failed: llguidance's first message line, the limit it names (None
    when it is no limit, e.g. nothing can follow), advice, and whether it failed before the probe
    chose anything (then every output fails there)."""

    message: str
    limit: str | None
    advice: str
    on_forced_path: bool


def probe(matcher: Any, tok: TokenizerInfo) -> ProbeFailure | None:
    """Walk ``matcher`` (a copy: it is consumed) over its first positions; None when healthy."""
    mask = np.zeros(tok.mask_words, dtype=np.int32)
    ptr, nbytes = mask.ctypes.data, mask.nbytes
    chosen = False
    for position in range(PROBE_POSITIONS + 1):
        if position == 0:  # the first mask, always (after it the lexer's shared start is built)
            matcher.unsafe_compute_mask_ptr(ptr, nbytes)
            if matcher.is_error():
                return _failure(matcher, chosen)
        if matcher.is_stopped():
            return None  # finished: nothing may follow
        forced = matcher.compute_ff_bytes()
        if matcher.is_error():
            return _failure(matcher, chosen)
        if forced:
            taken = _consume_forced(matcher, tok, forced)
            if matcher.is_error():
                return _failure(matcher, chosen)
            if taken:
                continue
        if position:
            matcher.unsafe_compute_mask_ptr(ptr, nbytes)
            if matcher.is_error():
                return _failure(matcher, chosen)
        token = _choose(mask, tok)
        if token is None:
            return None  # only EOS is allowed
        chosen = True
        if not matcher.consume_token(token):
            return _failure(matcher, chosen)
    return None


def _consume_forced(matcher: Any, tok: TokenizerInfo, forced: bytes) -> int:
    """Consume the forced bytes' tokens (at most PROBE_FORCED_BYTES); how many were taken."""
    cut = forced[:PROBE_FORCED_BYTES]
    tokens = tok.llguidance.tokenize_bytes(cut)
    if len(forced) > len(cut) and len(tokens) > 1:
        tokens = tokens[:-1]  # the last token may straddle the cut
    return try_consume(matcher, tokens)


def _choose(mask: np.ndarray, tok: TokenizerInfo) -> int | None:
    for token in _byte_tokens(tok):
        if mask[token >> 5] >> (token & 31) & 1:
            return token
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: tok.vocab_size]
    eos = set(tok.eos_token_ids)
    for token in np.flatnonzero(bits)[:64]:
        if int(token) not in eos:
            return int(token)
    return None


def _byte_tokens(tok: TokenizerInfo) -> tuple[int, ...]:
    """The tokens that are exactly one of PREFERRED's bytes, in PREFERRED's order (built once
    per tokenizer and kept by it, ``TokenizerInfo.derived``)."""
    return tok.derived(_find_byte_tokens)


def _find_byte_tokens(tok: TokenizerInfo) -> tuple[int, ...]:
    ll = tok.llguidance
    out = []
    for b in PREFERRED:
        ids = ll.tokenize_bytes(bytes([b]))
        if len(ids) == 1 and ll.decode_bytes(ids) == bytes([b]):
            out.append(ids[0])
    return tuple(out)


def _failure(matcher: Any, chosen: bool) -> ProbeFailure:
    message = first_line(matcher.get_error()) or "the matcher failed"
    limit, advice = classify(message)
    return ProbeFailure(message, limit, advice, on_forced_path=not chosen)
