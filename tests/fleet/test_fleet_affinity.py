"""The fleet's routing policy on real request bodies: prefix first, then the constraint, the
least loaded replica when nothing is held, and never a replica far busier than the rest."""

from __future__ import annotations

import json

from corral.fleet.affinity import (
    BLOCK_CHARS,
    AffinityIndex,
    Policy,
    rank_replicas,
    routing_key,
)

SYSTEM = "You are a careful assistant who answers in JSON. " * 40  # ~2,000 characters
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}


def scope(*headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http", "path": "/v1/chat/completions", "headers": list(headers)}


def chat(question: str, system: str = SYSTEM, **kw) -> bytes:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return json.dumps({"model": "m", "messages": messages, **kw}).encode()


def test_a_shared_long_prefix_is_a_shared_run_of_blocks() -> None:
    a, b = routing_key(scope(), chat("first?")), routing_key(scope(), chat("second?"))
    shared = sum(1 for x, y in zip(a.blocks, b.blocks, strict=False) if x == y)
    assert shared >= len(SYSTEM) // BLOCK_CHARS - 1
    other = routing_key(scope(), chat("first?", system="Another system prompt. " * 90))
    assert other.blocks[1] != a.blocks[1]  # same opening characters, different prompt


def test_the_constraint_digest_ignores_key_order_and_free_requests_have_none() -> None:
    fmt = json.loads(json.dumps(SCHEMA))
    reordered = {"json_schema": fmt["json_schema"], "type": fmt["type"]}
    assert (
        routing_key(scope(), chat("q", response_format=fmt)).constraint
        == routing_key(scope(), chat("other", response_format=reordered)).constraint
    )
    assert routing_key(scope(), chat("q")).constraint is None
    assert routing_key(scope(), b"not json").blocks == ()
    assert routing_key(scope((b"X-Corral-Replica", b"abc")), b"").pin == "abc"


def test_prefix_wins_then_constraint_then_the_least_loaded() -> None:
    index = AffinityIndex()
    replicas = ["r1", "r2", "r3"]
    idle = dict.fromkeys(replicas, 0)
    index.record("r2", routing_key(scope(), chat("earlier question")))
    index.record("r3", routing_key(scope(), chat("x", system="short", response_format=SCHEMA)))

    key = routing_key(scope(), chat("new question", response_format=SCHEMA))
    assert rank_replicas(key, replicas, idle, index) == [["r2"], ["r1", "r3"]]
    short = routing_key(scope(), chat("y", system="short", response_format=SCHEMA))
    assert rank_replicas(short, replicas, idle, index) == [["r3"], ["r1", "r2"]]
    fresh = routing_key(scope(), chat("z", system="a prompt nobody has sent " * 20))
    [[*all_of_them]] = rank_replicas(fresh, replicas, idle, index)
    assert sorted(all_of_them) == replicas


def test_a_busy_holder_loses_to_an_idle_replica_and_a_pin_wins() -> None:
    index = AffinityIndex()
    index.record("r1", routing_key(scope(), chat("earlier")))
    key = routing_key(scope(), chat("later"))
    policy = Policy(max_imbalance=4)
    assert rank_replicas(key, ["r1", "r2"], {"r1": 4, "r2": 0}, index, policy)[0] == ["r1"]
    [[*fallback]] = rank_replicas(key, ["r1", "r2"], {"r1": 5, "r2": 0}, index, policy)
    assert sorted(fallback) == ["r1", "r2"]  # Ray Serve then picks r2, the least loaded
    pinned = routing_key(scope((b"x-corral-replica", b"r2")), chat("later"))
    assert rank_replicas(pinned, ["r1", "r2"], {"r1": 0, "r2": 9}, index) == [["r2"]]


def test_a_replica_that_held_only_a_sliver_of_the_prompt_does_not_count() -> None:
    index = AffinityIndex()
    index.record("r1", routing_key(scope(), chat("q", system="S" * 200)))
    key = routing_key(scope(), chat("q", system="S" * 200 + "T" * 4000))
    assert len(rank_replicas(key, ["r1", "r2"], {}, index)) == 1  # no preference


def test_the_record_is_bounded_and_forgets_the_oldest() -> None:
    index = AffinityIndex(max_blocks=40)
    first = routing_key(scope(), chat("one"))
    index.record("r1", first)
    index.record("r1", routing_key(scope(), chat("two", system="another prompt " * 200)))
    assert index.prefix_blocks("r1", first) == 0
    index.forget("r1")
    assert index.prefix_blocks("r1", routing_key(scope(), chat("two"))) == 0
