"""The compile service: single-flight, cached refusals, deadlines (in process and in a worker)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from schema_cache_helpers import alive, nested_one_of, regex_specs

from corral.grammar import CompileUnavailable, ConstraintError, ConstraintSpec
from corral.schema_cache.routing import combinator_fanout, needs_process


def lark_alternatives(n: int) -> ConstraintSpec:
    """A grammar of n literal alternatives; llguidance's build time grows faster than n."""
    return ConstraintSpec.lark("start: " + " | ".join(f'"w{i}"' for i in range(n)))


def test_concurrent_requests_for_one_new_constraint_compile_it_once(make_service):
    service = make_service()
    spec = lark_alternatives(3000)
    n = 8
    barrier = threading.Barrier(n)
    results: list = []

    def request() -> None:
        barrier.wait()
        results.append(service.get_or_compile(spec))

    threads = [threading.Thread(target=request) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == n
    assert all(r is results[0] for r in results)
    stats = service.stats()
    assert stats["compiles"] == 1
    assert stats["singleflight_joins"] + stats["hits_memory"] == n - 1


def test_a_refusal_is_cached_for_its_ttl_then_compiled_again(make_service):
    service = make_service(failure_ttl_s=0.5)
    spec = ConstraintSpec.regex("(unclosed")
    with pytest.raises(ConstraintError) as first:
        service.get_or_compile(spec)
    with pytest.raises(ConstraintError) as second:
        service.get_or_compile(spec)
    assert (second.value.reason, second.value.keyword) == (first.value.reason, first.value.keyword)
    stats = service.stats()
    assert (stats["compile_failures"], stats["hits_failure"]) == (1, 1)
    time.sleep(0.6)
    with pytest.raises(ConstraintError):
        service.get_or_compile(spec)
    assert service.stats()["compile_failures"] == 2


def test_async_lookup_leaves_the_event_loop_free(make_service):
    service = make_service()
    spec = lark_alternatives(3000)

    async def main():
        ticks, done = 0, False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                await asyncio.sleep(0.001)
                ticks += 1

        task = asyncio.create_task(ticker())
        first = await service.aget_or_compile(spec)
        done = True
        await task
        return first, await service.aget_or_compile(spec), ticks

    first, second, ticks = asyncio.run(main())
    assert second is first
    assert ticks > 0, "the event loop did not run while the constraint compiled"


def test_in_process_deadline_is_unavailable_not_a_refusal_and_the_late_outcome_is_kept(
    make_service,
):
    service = make_service(isolation="thread", compile_deadline_s=1.0)
    slow = lark_alternatives(60_000)  # ~4 CPU-seconds to build, mostly without the GIL
    t0 = time.monotonic()
    with pytest.raises(CompileUnavailable) as err:
        service.get_or_compile(slow)
    assert time.monotonic() - t0 < 1.0 + 2.0
    assert (err.value.code, err.value.retry_after_s) == ("compile_timeout", 1)
    assert "deadline of 1 s" in err.value.reason
    stats = service.stats()
    assert (stats["deadline_hits"], stats["compiles_in_process"], stats["hits_failure"]) == (
        1,
        1,
        0,
    )
    # The abandoned build still runs; other compiles go on beside it.
    quick = regex_specs(1)[0]
    assert service.get_or_compile(quick).matcher().accept_tokens(service.tok.encode("r0-ab1")) > 0
    # Retries join the compile still running (never a second one), each waiting at most the
    # deadline; once it finishes, its outcome is the answer: here a refusal naming the row
    # limit (60,000 alternatives side by side), then cached like any refusal.
    give_up = time.monotonic() + 120
    while True:
        try:
            service.get_or_compile(slow)
        except CompileUnavailable:
            assert time.monotonic() < give_up, "the abandoned compile never finished"
            time.sleep(0.5)
            continue
        except ConstraintError as e:
            assert e.limit == "max_items_in_row"
            break
        raise AssertionError("60,000 alternatives side by side compiled")
    stats = service.stats()
    assert (stats["compiles_in_process"], stats["compile_failures"]) == (2, 1)  # + the quick one
    with pytest.raises(ConstraintError):
        service.get_or_compile(slow)
    assert service.stats()["hits_failure"] >= 1


def test_async_caller_gets_the_deadline_on_time_for_an_in_process_compile(make_service):
    # Everything compiles in the calling thread here ("auto" with no size limit on sources).
    service = make_service(
        isolation="auto", compile_deadline_s=1.0, inline_max_source_bytes=1 << 30
    )
    slow, quick = lark_alternatives(60_000), regex_specs(1, tag="async")[0]

    async def main():
        t0 = time.monotonic()
        with pytest.raises(CompileUnavailable, match="deadline of 1 s") as err:
            await service.aget_or_compile(slow)
        assert err.value.code == "compile_timeout"
        waited = time.monotonic() - t0
        return waited, await service.aget_or_compile(quick)

    waited, compiled = asyncio.run(main())
    assert waited < 1.0 + 2.0
    assert compiled.matcher().accept_tokens(service.tok.encode("async0-ab1")) > 0
    assert service.stats()["deadline_hits"] == 1


def test_worker_deadline_kills_the_worker_and_the_next_request_is_served(make_service):
    service = make_service(isolation="auto", compile_deadline_s=0.5)
    ebnf = ConstraintSpec.ebnf('root ::= "yes" | "no"')  # EBNF always compiles in a worker
    assert service.get_or_compile(ebnf).matcher().accept_tokens(service.tok.encode("yes")) == 1
    [first_worker] = service.worker_pids()

    pathological = ConstraintSpec.json_schema(nested_one_of(8))  # ~1 MB: seconds to compile
    assert needs_process(pathological, service.config.inline_max_source_bytes)
    t0 = time.monotonic()
    with pytest.raises(CompileUnavailable) as err:
        service.get_or_compile(pathological)
    assert time.monotonic() - t0 < 0.5 + 3.0
    assert err.value.code == "compile_timeout"
    assert "within its deadline of 0.5 s" in err.value.reason
    assert not alive(first_worker), "the worker past its deadline is still running"
    stats = service.stats()
    assert (stats["deadline_hits"], stats["worker_restarts"], stats["hits_failure"]) == (1, 1, 0)

    # Served next: an ordinary schema in process, and an EBNF grammar by the fresh worker.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    m = service.get_or_compile(ConstraintSpec.json_schema(schema)).matcher()
    assert m.accept_tokens(service.tok.encode('{"ok":true}')) == len(
        service.tok.encode('{"ok":true}')
    )
    other = ConstraintSpec.ebnf('root ::= "up" | "down"')
    assert service.get_or_compile(other).matcher().accept_tokens(service.tok.encode("down")) == 1
    workers = service.worker_pids()
    assert workers and first_worker not in workers
    service.close()
    assert not any(alive(pid) for pid in workers), "close() left a worker running"


def test_routing_sends_risky_constraints_to_a_worker():
    small = ConstraintSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    assert not needs_process(small, 64 * 1024)
    assert not needs_process(regex_specs(1)[0], 64 * 1024)
    assert needs_process(ConstraintSpec.ebnf('root ::= "a"'), 64 * 1024)
    assert needs_process(ConstraintSpec.json_schema(nested_one_of(6)), 64 * 1024)
    five_by_five = {"allOf": [{"anyOf": [{"minimum": i} for i in range(5)]} for _ in range(5)]}
    assert needs_process(ConstraintSpec.json_schema(five_by_five), 64 * 1024)


def test_combinator_fanout_multiplies_allof_and_adds_anyof():
    two, three = {"anyOf": [{}, {}]}, {"oneOf": [{}, {}, {}]}
    assert combinator_fanout({"type": "string"}) == 1
    assert combinator_fanout(three) == 3
    assert combinator_fanout({"allOf": [two, three]}) == 6
    assert combinator_fanout({"anyOf": [{"allOf": [two, two]}, {}]}) == 5
    assert combinator_fanout({"properties": {"x": {"allOf": [three, three, two]}}}) == 18
