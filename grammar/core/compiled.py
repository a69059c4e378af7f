"""CompiledConstraint: the immutable, shareable, serialisable result of a compile."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from corral.grammar.backends import llg as llg
from corral.grammar.backends import xgr as xgr
from corral.grammar.backends.llg_limits import check_raised
from corral.grammar.checks.distinct_keys import DistinctKeysMatcher, token_index
from corral.grammar.checks.value_checks import ValueChecksMatcher
from corral.grammar.checks.value_sites import MARKS, Sites, has_marks, value_sites
from corral.grammar.core.errors import Unenforced
from corral.grammar.core.matcher import Matcher
from corral.grammar.core.tokenizer import TokenizerInfo
from corral.grammar.core.version import ANALYSIS_VERSION
from corral.grammar.schema.rewrite_log import Rewritten

#: Bumped whenever the byte layout or the meaning of a stored payload changes.
FORMAT_VERSION = 4
_MAGIC = b"CORRALCC"
# Measured (glibc mallinfo2, Llama-3 tokenizer, grammars of 0.3-130 KB): an llguidance prototype
# holds about 56 KiB plus 60-90 bytes per byte of grammar text, before its lexer grows with use.
_LLG_BASE_BYTES = 64 * 1024
_LLG_BYTES_PER_GRAMMAR_BYTE = 90


@dataclass(frozen=True)
class _Backend:
    """What a compiled constraint does differently per backend, in one place: the version its
    entries are stamped with, rebuilding the native form from a payload (``load``), a fresh
    matcher over that form, and the native form's estimated memory."""

    version: str
    load: Callable[[bytes, TokenizerInfo, Mapping[str, int]], Any]
    matcher: Callable[[Any, frozenset[int]], Matcher]
    native_bytes: Callable[[bytes, Any], int]
    vocab_size: Callable[[Any], int]


def _llg_load(payload: bytes, tok: TokenizerInfo, limits: Mapping[str, int]) -> Any:
    return llg.new_prototype(payload.decode(), tok, keyword="", raised=limits)


def _llg_native_bytes(payload: bytes, native: Any) -> int:
    return _LLG_BASE_BYTES + _LLG_BYTES_PER_GRAMMAR_BYTE * len(payload)


def _llg_vocab_size(native: Any) -> int:
    return int(native.tokenizer.vocab_size)


def _xgr_vocab_size(native: Any) -> int:
    return int(native.tokenizer_info.vocab_size)


def _xgr_load(payload: bytes, tok: TokenizerInfo, limits: Mapping[str, int]) -> Any:
    return xgr.deserialize(payload, tok)  # llguidance's limits do not apply to xgrammar


def _xgr_matcher(native: Any, eos_token_ids: frozenset[int]) -> Matcher:
    return xgr.XGrammarMatcher(native)  # the stop tokens are compiled into xgrammar's grammar


def _xgr_native_bytes(payload: bytes, native: Any) -> int:
    return int(getattr(native, "memory_size_bytes", 0) or 0)


#: Every backend a CompiledConstraint may name, by the name stored in its entries.
_BACKENDS: Mapping[str, _Backend] = MappingProxyType(
    {
        llg.NAME: _Backend(
            llg.VERSION, _llg_load, llg.LLGuidanceMatcher, _llg_native_bytes, _llg_vocab_size
        ),
        xgr.NAME: _Backend(
            xgr.VERSION, _xgr_load, _xgr_matcher, _xgr_native_bytes, _xgr_vocab_size
        ),
    }
)


class CorruptEntry(ValueError):
    """Stored bytes that are truncated, garbled, or from another format, backend or tokenizer."""


class StaleEntry(CorruptEntry):
    """An intact entry compiled by another version of Corral's grammar code: a miss."""


@dataclass(frozen=True, eq=False)
class CompiledConstraint:
    """A compiled constraint for one tokenizer. Immutable; share it across requests.

    ``payload`` is what the backend needs to rebuild the compiled form: llguidance's grammar
    text (its compile is near-instant) or xgrammar's serialised compiled grammar. ``native`` is
    the rebuilt form itself (a prototype LLMatcher, or an xgrammar CompiledGrammar).
    """

    backend: str
    payload: bytes
    spec_digest: str
    tokenizer_fingerprint: str
    eos_token_ids: frozenset[int]
    unenforced: tuple[Unenforced, ...] = ()
    native: Any = field(default=None, repr=False)
    #: llguidance limits raised above their defaults for this constraint (see ``llg_limits``).
    limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: The grammar code that compiled it (``version.ANALYSIS_VERSION``).
    analysis_version: str = ANALYSIS_VERSION
    #: Outputs must not repeat a key within an object (``distinct_keys``; llguidance only).
    distinct_keys: bool = False
    #: The schema analysis's keyword rewrites (``rewrite_log``), for the receipt of every hit.
    rewrites: tuple[Rewritten, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in _BACKENDS:
            known = ", ".join(sorted(_BACKENDS))
            raise ValueError(f"unknown grammar backend {self.backend!r}; known: {known}")
        if self.distinct_keys and self.backend != llg.NAME:
            raise ValueError("distinct keys are checked over llguidance matchers only")
        object.__setattr__(self, "_sites", _value_sites(self.backend, self.payload))

    @property
    def size_bytes(self) -> int:
        """Estimated memory it holds: the payload plus the backend's native compiled form."""
        native = _BACKENDS[self.backend].native_bytes(self.payload, self.native)
        return len(self.payload) + native

    def matcher(self) -> Matcher:
        """A fresh per-request cursor; cheap (a copy of a prototype, or a new xgrammar matcher)."""
        inner = _BACKENDS[self.backend].matcher(self.native, self.eos_token_ids)
        if self.distinct_keys:
            tok = self.native.tokenizer
            inner = DistinctKeysMatcher(inner, token_index(tok), self.eos_token_ids)
        if self._sites is not None:  # type: ignore[attr-defined]
            sites = self._sites  # type: ignore[attr-defined]
            inner = ValueChecksMatcher(inner, sites, self.native.tokenizer, self.eos_token_ids)
        return inner

    @property
    def vocab_size(self) -> int:
        """How many tokens its masks cover: the full vocabulary it was compiled for."""
        return _BACKENDS[self.backend].vocab_size(self.native)

    @property
    def backend_version(self) -> str:
        return _BACKENDS[self.backend].version

    def to_bytes(self) -> bytes:
        """Self-describing bytes: magic, header length, JSON header, payload. Never pickle.

        The header's ``seal`` is a sha256 over the rest of the header and the payload, so any
        garbled byte anywhere makes the entry a :class:`CorruptEntry`."""
        header: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "backend": self.backend,
            "backend_version": self.backend_version,
            "spec_digest": self.spec_digest,
            "tokenizer": self.tokenizer_fingerprint,
            "unenforced": [list(u) for u in self.unenforced],
            "limits": dict(self.limits),
            "analysis": self.analysis_version,
            "distinct_keys": self.distinct_keys,
            "rewrites": [list(r) for r in self.rewrites],
        }
        header["seal"] = _seal(header, self.payload)
        raw = json.dumps(header).encode()
        return _MAGIC + struct.pack("<I", len(raw)) + raw + self.payload

    @classmethod
    def from_bytes(
        cls, data: bytes, tok: TokenizerInfo, *, spec_digest: str | None = None
    ) -> CompiledConstraint:
        """Rebuild from :meth:`to_bytes`; raises :class:`CorruptEntry` on anything unexpected."""
        header, payload = _split(data)
        if set(header) != _HEADER_KEYS or header["seal"] != _seal(header, payload):
            raise CorruptEntry("header or payload does not match its seal")
        if header.get("format") != FORMAT_VERSION:
            raise CorruptEntry(f"format {header.get('format')!r} is not {FORMAT_VERSION}")
        backend = _BACKENDS.get(header.get("backend"))
        if backend is None or header.get("backend_version") != backend.version:
            raise CorruptEntry(
                f"backend {header.get('backend')!r} {header.get('backend_version')!r} is not ours"
            )
        if header.get("analysis") != ANALYSIS_VERSION:
            raise StaleEntry("compiled by another version of Corral's grammar code")
        if header.get("tokenizer") != tok.fingerprint:
            raise CorruptEntry("compiled for another tokenizer")
        if spec_digest is not None and header.get("spec_digest") != spec_digest:
            raise CorruptEntry("compiled for another constraint")
        try:
            limits = check_raised(header["limits"])
            native = backend.load(payload, tok, limits)
        except Exception as e:  # a payload that passed the checksum but does not load
            raise CorruptEntry(f"payload does not load: {e}") from e
        return cls(
            backend=header["backend"],
            payload=payload,
            spec_digest=header["spec_digest"],
            tokenizer_fingerprint=tok.fingerprint,
            eos_token_ids=frozenset(tok.eos_token_ids),
            unenforced=_records(header["unenforced"], Unenforced),
            native=native,
            limits=MappingProxyType(limits),
            distinct_keys=header["distinct_keys"] is True,
            rewrites=_records(header["rewrites"], Rewritten),
        )


def _value_sites(backend: str, payload: bytes) -> Sites | None:
    """The sites of an llguidance JSON-schema grammar that has marks (``value_checks``)."""
    if backend != llg.NAME or not any(m.encode() in payload for m in MARKS):
        return None
    try:
        grammars = json.loads(payload).get("grammars", ())
    except ValueError:  # a Lark grammar: the compiler never lets a mark into one
        return None
    schema = grammars[0].get("json_schema") if len(grammars) == 1 else None
    return value_sites(schema) if has_marks(schema) else None


_HEADER_KEYS = {
    "format",
    "backend",
    "backend_version",
    "spec_digest",
    "tokenizer",
    "unenforced",
    "limits",
    "analysis",
    "distinct_keys",
    "rewrites",
    "seal",
}


def _records(items: Any, record: Any) -> tuple:
    """A header's list of string triples as ``record`` tuples (``Unenforced``, ``Rewritten``)."""
    if not isinstance(items, list) or not all(
        isinstance(i, list) and len(i) == 3 and all(isinstance(s, str) for s in i) for i in items
    ):
        raise CorruptEntry("garbled header records")
    return tuple(record(*i) for i in items)


def _seal(header: dict[str, Any], payload: bytes) -> str:
    body = json.dumps({k: v for k, v in header.items() if k != "seal"}, sort_keys=True).encode()
    return hashlib.sha256(body + b"\0" + payload).hexdigest()


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    if len(data) < len(_MAGIC) + 4 or not data.startswith(_MAGIC):
        raise CorruptEntry("not a compiled-constraint entry")
    (n,) = struct.unpack_from("<I", data, len(_MAGIC))
    start = len(_MAGIC) + 4
    if start + n > len(data):
        raise CorruptEntry("truncated header")
    try:
        header = json.loads(data[start : start + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptEntry(f"garbled header: {e}") from e
    if not isinstance(header, dict):
        raise CorruptEntry("garbled header")
    return header, data[start + n :]
