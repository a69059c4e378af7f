"""Worker compiles: N workers compile N constraints at once; a caller that goes away (its client
disconnected) stops a compile nobody else waits for, and leaves one that others wait for."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from schema_cache_helpers import accepts, alive, in_background, slow_ebnf, wait_until

from corral.grammar import ConstraintError, ConstraintSpec


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def warm(service, n: int) -> None:
    """Wait until ``n`` workers are ready (each answers one quick compile)."""
    threads = [
        in_background(service.get_or_compile, ConstraintSpec.ebnf(f'root ::= "w{i}" | "x"'))
        for i in range(n)
    ]
    for t, out in threads:
        t.join(300)
        assert "value" in out, out


def test_n_workers_compile_n_constraints_at_once(make_service):
    service = make_service(isolation="process", process_workers=2, compile_deadline_s=120)
    warm(service, 2)
    pids = service.worker_pids()
    assert len(pids) == 2
    before = {pid: cpu_seconds(pid) for pid in pids}
    jobs = [in_background(service.get_or_compile, slow_ebnf(40_000, tag)) for tag in "ab"]
    wait_until(lambda: service.stats()["compiles_in_worker"] == 4, what="both compiles to start")
    time.sleep(1.5)
    busy = {pid: cpu_seconds(pid) - before[pid] for pid in pids}
    assert all(seconds > 0.3 for seconds in busy.values()), busy  # both at work, at once
    for t, out in jobs:
        t.join(120)
        assert isinstance(out.get("error"), ConstraintError), out  # too many alternatives


def test_a_cancelled_caller_stops_a_worker_compile_nobody_else_waits_for(make_service):
    service = make_service(isolation="process", compile_deadline_s=120)
    warm(service, 1)
    [pid] = service.worker_pids()

    async def main() -> None:
        task = asyncio.create_task(service.aget_or_compile(slow_ebnf()))
        while service.stats()["compiles_in_worker"] < 2:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    wait_until(lambda: not alive(pid), timeout=10, what="the worker to be killed")
    wait_until(lambda: service.stats()["compiles_cancelled"] == 1, timeout=10, what="the count")
    stats = service.stats()
    assert (stats["worker_restarts"], stats["compile_failures"], stats["compile_errors"]) == (
        1,
        0,
        0,
    )
    assert accepts(service, ConstraintSpec.ebnf('root ::= "up" | "down"'), "up")
    assert pid not in service.worker_pids()


def test_a_compile_another_caller_waits_for_goes_on(make_service):
    service = make_service(isolation="process", compile_deadline_s=120)
    warm(service, 1)
    [pid] = service.worker_pids()
    spec = slow_ebnf(40_000)

    async def main() -> None:
        leaving = asyncio.create_task(service.aget_or_compile(spec))
        staying = asyncio.create_task(service.aget_or_compile(spec))
        while service.stats()["compiles_in_worker"] < 2:
            await asyncio.sleep(0.02)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        with pytest.raises(ConstraintError) as err:  # the compile's own outcome
            await staying
        assert err.value.limit == "max_items_in_row"

    asyncio.run(main())
    assert alive(pid) and service.worker_pids() == [pid]
    stats = service.stats()
    assert (stats["compiles_cancelled"], stats["compile_failures"]) == (0, 1)
    assert stats["singleflight_joins"] == 1


def test_a_cancelled_caller_drops_its_compile_while_it_waits_for_a_worker(make_service):
    service = make_service(isolation="process", compile_deadline_s=120)
    warm(service, 1)
    [pid] = service.worker_pids()
    busy, out = in_background(service.get_or_compile, slow_ebnf(40_000, "a"))  # holds the worker
    wait_until(lambda: service.stats()["compiles_in_worker"] == 2, what="the first compile")

    async def main() -> float:
        queued = asyncio.create_task(service.aget_or_compile(slow_ebnf(40_000, "b")))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        while service.stats()["compiles_cancelled"] < 1:
            await asyncio.sleep(0.02)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 1.0  # dropped from the queue, not compiled afterwards
    busy.join(120)
    assert isinstance(out.get("error"), ConstraintError), out  # the first one was untouched
    assert alive(pid) and service.stats()["worker_restarts"] == 0
    assert service.stats()["compiles_in_worker"] == 3
