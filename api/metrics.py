"""Prometheus metrics, in a registry per app (never the process-global one).

Request-path metrics (status counts, tokens, TTFT, inter-token latency) are observed as requests
run; engine and compile-service gauges are read from their ``stats()`` at scrape time, by the
exact keys those produce (``engine.stats.collect``, ``schema_cache.stats.CacheStats.snapshot``,
``Admission.stats``): a missing key is a bug and fails the scrape, never a silent zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)

StatsFn = Callable[[], Mapping[str, Any]]
FAILURE_CODES = ("constraint_failed", "sequence_failed", "engine_restarted", "engine_stopped")


class ServerMetrics:
    """The metrics one server exposes at ``/metrics``."""

    def __init__(
        self,
        engine_stats: StatsFn,
        compile_stats: StatsFn,
        admission_stats: StatsFn,
        forms_stats: StatsFn,
    ) -> None:
        """``forms_stats``: the server's schema forms by source (``SchemaForms.snapshot``)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "corral_requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.finished = Counter(
            "corral_generations",
            "admitted generations by endpoint and outcome (200, 4xx, 499 client left, 5xx)",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.failures = Counter(
            "corral_generation_failures",
            "generations that failed on the server's side, by code (constraint_failed, "
            "sequence_failed, engine_restarted, engine_stopped)",
            ["code"],
            registry=r,
        )
        for code in FAILURE_CODES:  # shown at 0 before the first failure
            self.failures.labels(code=code)
        self.prompt_tokens = Counter("corral_prompt_tokens", "prompt tokens processed", registry=r)
        self.completion_tokens = Counter("corral_completion_tokens", "tokens generated", registry=r)
        self.cached_tokens = Counter(
            "corral_radix_cache_hit_tokens",
            "prompt tokens served from the radix prefix cache",
            registry=r,
        )
        self.ttft = Histogram(
            "corral_time_to_first_token_seconds",
            "from request arrival to its first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "corral_inter_token_latency_seconds",
            "time between consecutive generated tokens of one choice",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "corral_request_duration_seconds",
            "from arrival to the last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_StatsCollector(engine_stats, compile_stats, admission_stats, forms_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StatsCollector(Collector):
    """Gauges and counters read from the engine and the compile service when scraped."""

    def __init__(
        self, engine: StatsFn, compiles: StatsFn, admission: StatsFn, forms: StatsFn
    ) -> None:
        self._engine, self._compiles, self._admission = engine, compiles, admission
        self._forms = forms

    def describe(self) -> list:
        return []  # dynamic: describe nothing, so registration does not call collect()

    def collect(self) -> Iterator[Any]:
        yield from _engine_metrics(self._engine())  # read now: never older than the scrape
        yield from _compile_metrics(self._compiles())
        forms = CounterMetricFamily(
            "corral_schema_forms",
            "json_schema response formats by where their spec came from: derived from the schema, "
            "remembered from an earlier request, or seeded by another replica's published entry",
            labels=["source"],
        )
        for source, n in self._forms().items():
            forms.add_metric([source], float(n))
        yield forms
        yield GaugeMetricFamily(
            "corral_requests_in_flight",
            "requests admitted and not finished",
            value=self._admission()["in_flight"],
        )


def _engine_metrics(s: Mapping[str, Any]) -> Iterator[Any]:
    yield GaugeMetricFamily(
        "corral_queue_depth", "requests admitted but waiting for the engine", value=s["waiting"]
    )
    yield GaugeMetricFamily("corral_running_requests", "sequences decoding now", value=s["running"])
    yield GaugeMetricFamily(
        "corral_kv_cache_usage_ratio",
        "fraction of KV-pool slots in use (running sequences and the prefix cache)",
        value=s["kv_usage"],
    )
    yield GaugeMetricFamily(
        "corral_kv_request_tokens",
        "KV slots held by requests outside the prefix cache (0 when idle, or a leak)",
        value=s["kv_request_tokens"],
    )
    yield GaugeMetricFamily(
        "corral_kv_capacity_tokens", "KV-pool slots in all", value=s["kv_capacity_tokens"]
    )
    yield GaugeMetricFamily(
        "corral_radix_cached_tokens",
        "tokens held by the radix prefix cache now (kept after their requests, evicted under "
        "pressure)",
        value=s["radix_cached_tokens"],
    )
    yield GaugeMetricFamily(
        "corral_radix_locked_tokens",
        "prefix-cache tokens pinned by running requests (0 when idle, or a leak)",
        value=s["radix_locked_tokens"],
    )
    deferrals = CounterMetricFamily(
        "corral_mask_deferrals",
        "constrained rows that sat a step out because their grammar mask missed the deadline",
    )
    deferrals.add_metric([], float(s["mask_deferrals"]))
    yield deferrals
    for key, name, doc in (
        ("lookup_draft_tokens", "proposed", "draft tokens proposed by prompt lookup and verified"),
        ("lookup_draft_accepted", "accepted", "prompt-lookup draft tokens the sampled tokens "
         "confirmed (each saved a forward pass)"),
        ("draft_tokens", "draft", "draft tokens verified, lookup and grammar-forced text"),
        ("draft_accepted", "draft_accepted", "draft tokens confirmed, lookup and grammar"),
    ):  # fmt: skip
        family = CounterMetricFamily(f"corral_speculative_{name}_tokens", doc)
        family.add_metric([], float(s[key]))
        yield family


def _compile_metrics(s: Mapping[str, Any]) -> Iterator[Any]:
    by_source = CounterMetricFamily(
        "corral_constraint_compiles",
        "constraints obtained, by where they came from",
        labels=["source"],
    )
    by_source.add_metric(["memory"], float(s["hits_memory"]))
    by_source.add_metric(["disk"], float(s["hits_disk"]))
    by_source.add_metric(["redis"], float(s["hits_redis"]))
    by_source.add_metric(["compiled"], float(s["compiles"]))
    yield by_source
    held = GaugeMetricFamily(
        "corral_constraint_cache_bytes",
        "compiled constraints held by the cache now, by tier: memory (the LRU's estimate of its "
        "entries) and disk (the folder's size as last scanned plus this process's writes)",
        labels=["tier"],
    )
    held.add_metric(["memory"], float(s["memory_bytes"]))
    held.add_metric(["disk"], float(s["disk_bytes"]))
    yield held
    yield GaugeMetricFamily(
        "corral_constraint_cache_entries",
        "compiled constraints held in the memory LRU now",
        value=s["memory_entries"],
    )
    failures = CounterMetricFamily(
        "corral_constraint_compile_failures",
        "constraints refused as a client mistake (cached or not)",
    )
    failures.add_metric([], float(s["compile_failures"] + s["hits_failure"]))
    yield failures
    seconds = CounterMetricFamily(
        "corral_constraint_compile_seconds", "time spent compiling constraints"
    )
    seconds.add_metric([], float(s["compile_seconds_sum"]))
    yield seconds
    count = CounterMetricFamily(
        "corral_constraint_compile_count", "compiles timed in compile_seconds"
    )
    count.add_metric([], float(s["compile_seconds_count"]))
    yield count
    yield from _counters(
        s,
        ("corral_constraint_compile_unavailable", "compiles that missed their deadline or lost "
         "their worker (HTTP 503)", ("deadline_hits", "worker_failures")),
        ("corral_constraint_compiles_cancelled", "compiles stopped because every request "
         "waiting for them had left", ("compiles_cancelled",)),
        ("corral_constraint_cache_redis_errors", "Redis commands of the shared cache tier that "
         "failed or timed out (each request was served from the local tiers)", ("redis_errors",)),
        ("corral_constraint_cache_redis_lock_waits", "misses that waited for another replica "
         "compiling the same constraint", ("redis_lock_waits",)),
        ("corral_constraint_cache_prefetched", "constraints other replicas compiled, loaded into "
         "memory before a request asked for them", ("prefetched",)),
    )  # fmt: skip
    rejected = CounterMetricFamily(
        "corral_constraint_cache_rejected_entries",
        "disk and Redis entries not served because their seal failed (unsealed, wrong_key, "
        "bad_mac, truncated, malformed) or they do not fit where they were found (invalid); "
        "each was recompiled and sealed again",
        labels=["tier", "reason"],
    )
    for where, n in s["rejected_entries"].items():
        rejected.add_metric(where.split("/"), float(n))
    yield rejected
    redis = GaugeMetricFamily(
        "corral_constraint_cache_redis_state",
        "the shared Redis tier: 1 for its state now (off: none configured; down: degraded, "
        "served from memory and disk)",
        labels=["state"],
    )
    for state in ("off", "ok", "down"):
        redis.add_metric([state], float(s["redis_state"] == state))
    yield redis


def _counters(s: Mapping[str, Any], *specs: tuple[str, str, tuple[str, ...]]) -> Iterator[Any]:
    """Unlabelled counters, each the sum of some compile-service figures."""
    for name, doc, keys in specs:
        family = CounterMetricFamily(name, doc)
        family.add_metric([], float(sum(s[k] for k in keys)))
        yield family
