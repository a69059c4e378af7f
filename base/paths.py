"""Where Corral keeps its files: one cache folder, ``$CORRAL_CACHE_DIR`` or ``~/.cache/corral``.

The converted models live in its ``models/`` folder (``corral.engine.loading.assets``), the compiled
constraints in ``constraints/`` (``corral.schema_cache``); every layer asks here.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that moves the whole cache folder.
CACHE_DIR_ENV = "CORRAL_CACHE_DIR"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache folder: the argument, else ``$CORRAL_CACHE_DIR``, else ``~/.cache/corral``."""
    chosen = cache_dir if cache_dir is not None else os.environ.get(CACHE_DIR_ENV)
    return Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "corral"


def constraints_root(cache_dir: str | Path | None = None) -> Path:
    """The compiled-constraint store's folder inside the cache folder."""
    return cache_root(cache_dir) / "constraints"
