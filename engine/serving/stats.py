"""The engine's figures for `/metrics` and benches: gauges read now, counters since start."""

from __future__ import annotations

from collections import Counter

from corral.engine.kvcache.cache_manager import CacheManager
from corral.engine.serving.scheduler import Scheduler

COUNTERS = (
    "requests",
    "aborted",
    "failed",
    "prompt_tokens",
    "output_tokens",
    "steps",
    "batched_tokens",
    "seq_forward_passes",
    "draft_tokens",
    "draft_accepted",
    "lookup_draft_tokens",
    "lookup_draft_accepted",
    "forced_tokens",
    "jump_forward_tokens",
    "step_seconds",
    "mask_deferrals",
)


def collect(counters: Counter[str], scheduler: Scheduler, cache: CacheManager) -> dict[str, float]:
    """Every key is always present.

    Gauges: `waiting` (queue depth, in sequences), `running`, `kv_capacity_tokens`,
    `kv_free_tokens`, `kv_usage` (fraction of KV slots held by sequences or the prefix cache),
    `radix_cached_tokens` (tokens in the prefix cache now), `kv_request_tokens` (slots held by
    requests outside the prefix cache) and `radix_locked_tokens` (prefix-cache tokens pinned by
    requests): both are 0 whenever no request is running, or something leaked.

    Counters since start: `radix_hit_tokens` (prompt tokens served from the prefix cache),
    `preemptions`, `forward_passes` (model forward calls: one per step), `seq_forward_passes`
    (passes each sequence took part in, summed), `output_tokens`, `draft_tokens` (jump-forward
    draft tokens fed for verification), `draft_accepted`, `lookup_draft_tokens` and
    `lookup_draft_accepted` (the part of those two from lookup drafts), `forced_tokens`
    (appended with no selection pass), `jump_forward_tokens` (draft_accepted + forced_tokens),
    `failed` (sequences ended with finish reason "error"), `step_seconds` (time inside
    `Engine.step`), `mask_deferrals` (rows that sat a step out because their grammar mask
    missed the step's deadline), and the rest of `COUNTERS`.

    Ratios: `forward_passes_per_output_token` (seq_forward_passes / output_tokens),
    `draft_acceptance_rate` (draft_accepted / draft_tokens).
    """
    c = counters
    pool = cache.pool
    return {
        "waiting": len(scheduler.waiting),
        "running": len(scheduler.running),
        "kv_capacity_tokens": pool.capacity,
        "kv_free_tokens": pool.num_free,
        "kv_usage": 1 - pool.num_free / pool.capacity,
        "radix_cached_tokens": cache.radix.total_size,
        "kv_request_tokens": pool.capacity - pool.num_free - cache.radix.total_size,
        "radix_locked_tokens": cache.radix.protected_size,
        "radix_hit_tokens": cache.hit_tokens,
        "preemptions": scheduler.num_preemptions,
        "forward_passes": c["steps"],
        **{k: c[k] for k in COUNTERS},
        "forward_passes_per_output_token": c["seq_forward_passes"] / max(1, c["output_tokens"]),
        "draft_acceptance_rate": c["draft_accepted"] / max(1, c["draft_tokens"]),
    }
