"""What the compile service hands out, and the address it keeps it under.

``entry_key`` is the content address of one compiled constraint in every tier (memory, disk,
Redis): the constraint's digest, the tokenizer's fingerprint, the entry format, the disk store's
layout and the grammar code's version, so nothing compiled for another of them is ever served.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from corral.grammar import CompiledConstraint
from corral.grammar.core.compiled import FORMAT_VERSION
from corral.grammar.core.version import ANALYSIS_VERSION
from corral.schema_cache.disk import STORE_VERSION


def entry_key(
    spec_digest: str, tokenizer_fingerprint: str, analysis_version: str = ANALYSIS_VERSION
) -> str:
    """The content address of one compiled constraint (its disk path derives from it)."""
    text = (
        f"{spec_digest}|{tokenizer_fingerprint}|{FORMAT_VERSION}|{STORE_VERSION}|{analysis_version}"
    )
    return hashlib.sha256(text.encode()).hexdigest()


class Lookup(NamedTuple):
    """A compiled constraint and where it came from: memory, disk, redis, compiled or shared
    (another caller in this process compiled it meanwhile); ``compile_s``: the compile's own
    seconds when this call compiled it (``source == "compiled"``), else 0."""

    compiled: CompiledConstraint
    source: str
    compile_s: float = 0.0
