"""The persistent compiled-constraint cache and the compile service.

``CompileService(tok, CacheConfig(...)).get_or_compile(spec)`` answers from a memory LRU, then
from a content-addressed disk store shared by processes, and only then compiles — once per key
however many callers ask at the same time, within a deadline, remembering refusals for a while.

Names are imported on first use, so that ``corral cache stats|clear`` (which need only the disk
store) start without loading the grammar backends.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "CACHE_DIR_ENV": "config",
    "CacheConfig": "config",
    "default_root": "config",
    "DiskStore": "disk",
    "DiskUsage": "disk",
    "COUNTERS": "stats",
    "CompileService": "service",
    "Lookup": "service",
    "entry_key": "service",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"corral.schema_cache.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
