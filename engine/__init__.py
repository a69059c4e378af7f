"""The engine: model, KV pool, radix cache, scheduler, sampler and the (async) step loop.

Public names are imported lazily, so `import corral.engine.kvcache.kv_pool` stays light.
"""

from __future__ import annotations

from corral.base.lazy import lazy_exports

_EXPORTS = {
    "AsyncEngine": "serving.async_engine",
    "EngineDeadError": "serving.async_engine",
    "EngineUnavailable": "serving.async_engine",
    "CollectedChoice": "serving.core",
    "EngineFailure": "serving.core",
    "Output": "serving.core",
    "RequestError": "serving.core",
    "SamplingParams": "serving.core",
    "TokenLogprob": "serving.core",
    "Engine": "serving.engine",
    "EngineConfig": "serving.config",
    "LoadedModel": "loading.assets",
    "load_model": "loading.assets",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
