"""ANALYSIS_VERSION: a digest of this package's source, so caches never outlive the compiler.

A compiled constraint depends on Corral's own schema analysis, rewrites, probe and backend glue
as much as on the backend's version. The compiled-constraint cache puts this digest into every
entry's key and header, so an upgrade that changes any of that code never serves a grammar
compiled by the old one. It is computed once, at import, from the installed ``.py`` files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def source_digest(folder: Path = PACKAGE_DIR) -> str:
    """Hex sha256 over the names and bytes of the ``.py`` files directly in ``folder``."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


#: The digest of the grammar package as installed (see the module docstring).
ANALYSIS_VERSION = source_digest()
