"""The engine: model, KV pool, radix cache, scheduler, sampler and the (async) step loop.

Public names are imported lazily, so `import corral.engine.kv_pool` stays light.
"""

from __future__ import annotations

from corral.lazy import lazy_exports

_EXPORTS = {
    "AsyncEngine": "async_engine",
    "EngineDeadError": "async_engine",
    "EngineUnavailable": "async_engine",
    "CollectedChoice": "core",
    "EngineFailure": "core",
    "Output": "core",
    "RequestError": "core",
    "SamplingParams": "core",
    "TokenLogprob": "core",
    "Engine": "engine",
    "EngineConfig": "config",
    "LoadedModel": "assets",
    "load_model": "assets",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
