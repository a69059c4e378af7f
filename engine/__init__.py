"""The engine: model, KV pool, radix cache, scheduler, sampler and the (async) step loop.

Public names are imported lazily, so `import corral.engine.kv_pool` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncEngine": "corral.engine.async_engine",
    "EngineDeadError": "corral.engine.async_engine",
    "EngineUnavailable": "corral.engine.async_engine",
    "EngineFailure": "corral.engine.core",
    "Completion": "corral.engine.core",
    "Output": "corral.engine.core",
    "RequestError": "corral.engine.core",
    "SamplingParams": "corral.engine.core",
    "TokenLogprob": "corral.engine.core",
    "Engine": "corral.engine.engine",
    "EngineConfig": "corral.engine.config",
    "LoadedModel": "corral.engine.assets",
    "load_model": "corral.engine.assets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'corral.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
