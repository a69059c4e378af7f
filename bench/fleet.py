"""`corral fleet` with 2 replicas on this machine: what the shared compile cache and the router buy.

1. Time to first token of a never-seen schema on one replica (a cold compile) vs the same schema
   on the other replica right after, the way a client would send it: once its request to the
   first replica has its whole response. By then the first replica has published the entry to
   Redis and announced it, and the other replica has loaded it in the background (prefetch) or
   is loading it (the request joins the load). The replicas share this machine's disk cache, so
   its entries are deleted in between: the second replica finds the schema where a replica on
   another machine would, in Redis or its own memory. Schemas: the slowest to compile of the
   largest MaskBench schemas (the compiles a shared cache is for; their in-process compile times
   are printed first); the two replicas take turns being first. Then, for each schema again
   (a `$comment` makes it never-seen), how long after the entry was published the other
   replica's prefetch landed, polling its /metrics.
2. Prefix-cache hit rate (cached prompt tokens / prompt tokens) of the router vs round-robin
   (requests pinned to the replicas in turn) on the same workload: P long system prompts, M
   questions each, in shuffled order, one request at a time.

    .venv/bin/python -m bench.fleet                     # starts a redis-server itself
    .venv/bin/python -m bench.fleet --cache-url redis://127.0.0.1:6379/0
    .venv/bin/python -m bench.fleet --no-prefetch       # the Redis tier alone, fetched on request
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.provenance import free_port, header
from corral.api.config import ServerConfig
from corral.base.paths import constraints_root
from corral.fleet.affinity import REPLICA_HEADER
from corral.fleet.app import FleetConfig, FleetRunner
from corral.schema_cache.redis_store import ANNOUNCE, PREFIX

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench"


def slowest_schemas(corpus: Path, scan: int, n: int) -> list[dict]:
    """The `n` slowest to compile (strict, the served model's tokenizer, no cache) of the `scan`
    largest MaskBench schemas: what a shared compile cache is for. Refused ones are left out."""
    from corral.cli_cache import _served_tokenizer
    from corral.grammar import (
        CompiledConstraint,
        ConstraintError,
        ConstraintSpec,
        compile_constraint,
    )

    tok = _served_tokenizer(None)
    sized = sorted(((p.stat().st_size, p) for p in corpus.glob("*.json")), reverse=True)
    timed = []
    for _, path in sized[:scan]:
        schema = json.loads(path.read_text())["schema"]
        spec = ConstraintSpec.json_schema(schema, strict=True)
        t0 = time.perf_counter()
        try:
            compiled = compile_constraint(spec, tok)
        except ConstraintError:
            continue
        timed.append((time.perf_counter() - t0, path.stem, schema, compiled.to_bytes()))
    timed.sort(key=lambda t: t[0], reverse=True)
    all_ms = sorted(t[0] * 1e3 for t in timed)
    loads = []
    for _, _, _, data in timed[:n]:  # what a replica that fetches the entry pays to load it
        t0 = time.perf_counter()
        CompiledConstraint.from_bytes(data, tok)
        loads.append(time.perf_counter() - t0)
    each = [
        f"{t[1]} {t[0] * 1e3:.0f} / {load * 1e3:.0f} ms"
        for t, load in zip(timed, loads, strict=False)
    ]
    print(f"in-process compile of the {scan} largest schemas ({len(timed)} compiled): median "
          f"{statistics.median(all_ms):.0f} ms, max {all_ms[-1]:.0f} ms; timing the {n} slowest "
          "(compile / load of its entry): " + ", ".join(each))  # fmt: skip
    return [schema for _, _, schema, _ in timed[: 2 * n]]


def plain_ttft(url: str, model: str, n: int = 10) -> float:
    """Median time to the first token of an unconstrained request: the fleet's floor."""
    body = {"messages": [{"role": "user", "content": "Fill in this form as JSON."}],
            "max_tokens": 4, "temperature": 0, "model": model}  # fmt: skip
    return statistics.median(stream_ttft(url, body, None)[0] for _ in range(n))


def stream_ttft(url: str, body: dict, replica: str | None) -> tuple[float, str, int]:
    """(seconds to the first content delta, replica that answered, HTTP status)."""
    headers = {REPLICA_HEADER: replica} if replica else {}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body | {"stream": True},
                      headers=headers, timeout=300) as r:  # fmt: skip
        if r.status_code != 200:
            r.read()
            return 0.0, r.headers.get(REPLICA_HEADER, "?"), r.status_code
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {") and _has_content(json.loads(line[6:])):
                ttft = time.perf_counter() - t0
                break
        else:
            ttft = float("nan")
        for _ in lines:  # the rest of the stream
            pass
    return ttft, r.headers[REPLICA_HEADER], 200


def _has_content(chunk: dict) -> bool:
    return any(c.get("delta", {}).get("content") for c in chunk.get("choices", ()))


def replica_ids(url: str) -> list[str]:
    seen: set[str] = set()
    while len(seen) < 2:
        seen.add(httpx.get(url + "/health", timeout=30).headers[REPLICA_HEADER])
    return sorted(seen)


def entries(redis_client) -> set[bytes]:
    return {k for k in redis_client.keys(PREFIX + "*") if not k.endswith(b":lock")}


def wait_published(redis_client, before: set[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if entries(redis_client) - before:
            return
        time.sleep(0.05)
    raise SystemExit("the compiled constraint never reached Redis")


class Announcements:
    """The bench's own subscription to the replicas' announcements of new entries: when each
    was published (``time.perf_counter()`` on arrival here)."""

    def __init__(self, redis_client) -> None:
        self._channel = redis_client.pubsub(ignore_subscribe_messages=True)
        self._channel.subscribe(ANNOUNCE)
        self._times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            message = self._channel.get_message(timeout=0.1)
            if message is not None and message["type"] == "message":
                self._times.append(time.perf_counter())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._channel.close()

    def first_after(self, t0: float) -> float:
        return next((t for t in self._times if t >= t0), float("nan"))


def counters(url: str, replica: str) -> dict[str, float]:
    """The replica's prefetched entries and memory hits, from its /metrics."""
    text = httpx.get(url + "/metrics", headers={REPLICA_HEADER: replica}, timeout=30).text
    names = {"corral_constraint_cache_prefetched_total": "prefetched",
             'corral_constraint_compiles_total{source="memory"}': "memory"}  # fmt: skip
    found = {"prefetched": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in names:
            found[names[name]] = float(value)
    return found


def chat(model: str, schema: dict, name: str) -> dict:
    return {"messages": [{"role": "user", "content": "Fill in this form as JSON."}],
            "max_tokens": 4, "temperature": 0, "model": model,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": name, "schema": schema}}}  # fmt: skip


def compile_sharing(url: str, model: str, cache: Path, replicas: list[str], schemas: list,
                    want: int, redis) -> list[dict]:  # fmt: skip
    """TTFT cold vs on the other replica right after; the schemas that were timed."""
    cold, shared, warm, timed = [], [], [], []
    for i, schema in enumerate(schemas):
        if len(cold) == want:
            break
        first, second = replicas if len(cold) % 2 == 0 else replicas[::-1]
        body = chat(model, schema, f"s{i}")
        before, seen = entries(redis), counters(url, second)
        t_cold, who, status = stream_ttft(url, body, first)  # the whole response, then ...
        if status != 200:
            print(f"  schema {i}: HTTP {status} (not compilable here), skipped")
            continue
        assert who == first
        wait_published(redis, before)
        for entry in constraints_root(cache).rglob("*.cc"):
            entry.unlink()
        t_shared, who, _ = stream_ttft(url, body, second)  # ... at once to the other replica
        assert who == second
        now = counters(url, second)
        t_warm, _, _ = stream_ttft(url, body, second)  # now in the replica's memory
        if now["memory"] > seen["memory"]:
            how = "prefetched: a memory hit"
        elif now["prefetched"] > seen["prefetched"]:
            how = "joined its prefetch"
        else:
            how = "fetched from Redis on request"
        cold.append(t_cold), shared.append(t_shared), warm.append(t_warm), timed.append(schema)
        print(f"  schema {i}: cold {t_cold * 1e3:7.1f} ms   other replica {t_shared * 1e3:7.1f} ms "
              f"({how})   in memory {t_warm * 1e3:7.1f} ms")  # fmt: skip
    c, s, w = (statistics.median(x) for x in (cold, shared, warm))
    print(f"time to first token, median of {len(cold)} schemas: cold compile {c * 1e3:.1f} ms, "
          f"on the other replica right after {s * 1e3:.1f} ms, in memory {w * 1e3:.1f} ms; "
          f"other replica / cold = {s / c:.2f}x (target <= 0.3x)")  # fmt: skip
    return timed


def landing(
    url: str, model: str, first: str, second: str, schema: dict, name: str
) -> tuple[float, float, float]:
    """(when ``second`` had the entry in memory, when the request to ``first`` was sent, when
    its response ended): ``schema`` made never-seen by a ``$comment``."""
    body = chat(model, schema | {"$comment": "landing"}, name)
    seen = counters(url, second)["prefetched"]
    t0 = time.perf_counter()
    stream_ttft(url, body, first)
    t_response = time.perf_counter()
    while counters(url, second)["prefetched"] == seen:
        if time.perf_counter() > t_response + 120:
            raise SystemExit(f"{name} was never prefetched by replica {second}")
        time.sleep(0.02)
    return time.perf_counter(), t0, t_response


def prefetch_landing(url: str, model: str, replicas: list[str], schemas: list, redis) -> None:
    """How long after publishing an entry it is in the other replica's memory (polled)."""
    announced = Announcements(redis)
    after_publish, after_response = [], []
    try:
        for i, schema in enumerate(schemas):
            first, second = replicas if i % 2 == 0 else replicas[::-1]
            t_landed, t0, t_response = landing(url, model, first, second, schema, f"l{i}")
            after_publish.append(t_landed - announced.first_after(t0))
            after_response.append(t_landed - t_response)
            print(f"  schema {i}: in the other replica's memory {after_publish[-1] * 1e3:7.1f} ms "
                  f"after it was published, {after_response[-1] * 1e3:+7.1f} ms after the "
                  f"first replica's response ended")  # fmt: skip
    finally:
        announced.close()
    print(f"prefetch landed a median {statistics.median(after_publish) * 1e3:.0f} ms after the "
          f"entry was published (max {max(after_publish) * 1e3:.0f} ms), a median "
          f"{statistics.median(after_response) * 1e3:+.0f} ms after the first replica's response "
          f"ended (polled every 20 ms)")  # fmt: skip


def workload(tag: str, prefixes: int, questions: int, seed: int) -> list[list[dict]]:
    """``prefixes`` x ``questions`` conversations, shuffled; each prompt starts with ~1,500
    characters shared with its prefix group."""
    words = "ledger archive census harbour lantern orchard quarry meadow beacon".split()
    rng = random.Random(seed)
    systems = [f"[{tag} {p}] You keep the records of the {rng.choice(words)} office. " +
               " ".join(rng.choice(words) for _ in range(220)) for p in range(prefixes)]  # fmt: skip
    convs = [[{"role": "system", "content": s}, {"role": "user", "content": f"Question {q}?"}]
             for s in systems for q in range(questions)]  # fmt: skip
    rng.shuffle(convs)
    return convs


def hit_rate(url: str, model: str, convs: list, pins: list[str] | None) -> float:
    cached = prompt = 0
    for i, messages in enumerate(convs):
        headers = {REPLICA_HEADER: pins[i % len(pins)]} if pins else {}
        r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=300,
                       json={"model": model, "messages": messages, "max_tokens": 1})  # fmt: skip
        r.raise_for_status()
        usage = r.json()["usage"]
        cached += usage["prompt_tokens_details"]["cached_tokens"]
        prompt += usage["prompt_tokens"]
    return cached / prompt


def run(tmp: Path, args: argparse.Namespace, cache_url: str) -> None:
    import redis

    from corral.engine.loading.assets import resolve_model_folder

    cache = tmp / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(resolve_model_folder(None).parent)
    key = tmp / "cache.key"  # the key the replicas seal their shared entries under
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    server = ServerConfig(port=free_port(), cache_dir=str(cache), cache_url=cache_url,
                          cache_key_file=str(key),
                          memory_bytes=512 << 20, max_concurrent=4, compile_workers=1,
                          cache_prefetch=args.prefetch, log_level="warning")  # fmt: skip
    config = FleetConfig(server=server, replicas=2)
    url = f"http://127.0.0.1:{server.port}"
    with FleetRunner(config):
        replicas = replica_ids(url)
        model = httpx.get(url + "/health", timeout=30).json()["model"]
        print(f"2 replicas, {config.replica_threads} torch threads each: {replicas}")
        print(f"time to first token of an unconstrained request (median of 10): "
              f"{plain_ttft(url, model) * 1e3:.1f} ms")  # fmt: skip
        with redis.Redis.from_url(cache_url) as client:
            schemas = slowest_schemas(CORPUS, args.scan, args.schemas)
            timed = compile_sharing(url, model, cache, replicas, schemas, args.schemas, client)
            if args.prefetch:
                prefetch_landing(url, model, replicas, timed, client)
        shape = (args.prefixes, args.questions)
        routed = hit_rate(url, model, workload("router", *shape, seed=1), None)
        rr = hit_rate(url, model, workload("round-robin", *shape, seed=1), replicas)
        print(f"prefix-cache hit rate ({args.prefixes} prefixes x {args.questions} questions, "
              f"shuffled, one at a time): router {routed:.3f}, round-robin {rr:.3f}, "
              f"router / round-robin = {routed / rr:.2f}x")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-url", help="a Redis to use; default: start a redis-server here")
    ap.add_argument("--schemas", type=int, default=8, help="slowest-compiling schemas to time")
    ap.add_argument("--scan", type=int, default=120, help="largest schemas to pick them from")
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=True,
                    help="the replicas' --cache-prefetch (default: on)")  # fmt: skip
    args = ap.parse_args(argv)
    print(header(__file__), flush=True)
    from tests.redis_server import RedisServer  # the tests' real redis-server, the same way

    with tempfile.TemporaryDirectory(prefix="corral-fleet-bench-") as tmp:
        redis_server = None if args.cache_url else RedisServer(Path(tmp) / "redis")
        try:
            run(Path(tmp), args, args.cache_url or redis_server.url)
        finally:
            if redis_server is not None:
                redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
