"""The persistent compiled-constraint cache and the compile service.

``CompileService(tok, CacheConfig(...)).get_or_compile(spec)`` answers from a memory LRU, then
from a content-addressed disk store shared by processes, and only then compiles — once per key
however many callers ask at the same time, within a deadline, remembering refusals for a while.

Names are imported on first use, so that ``corral cache stats|clear`` (which need only the disk
store) start without loading the grammar backends.
"""

from corral.base.lazy import lazy_exports

_EXPORTS = {
    "CacheConfig": "config",
    "DiskStore": "disk",
    "DiskUsage": "disk",
    "COUNTERS": "stats",
    "CompileService": "service",
    "Lookup": "entries",
    "entry_key": "entries",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
