"""SerialQueue's gate: background writes wait for a quiet moment, flush does not wait."""

from __future__ import annotations

import threading
import time

from corral.schema_cache.threads import SerialQueue


def _gated_queue(open_at: list[float]) -> tuple[SerialQueue, list[float]]:
    ran: list[float] = []

    def gate(submitted: float) -> float:
        return open_at[0] - time.monotonic()

    return SerialQueue("test-writes", gate=gate, poll_s=0.01), ran


def test_a_gated_call_waits_for_the_gate_then_runs_in_order():
    open_at = [time.monotonic() + 0.3]
    q, ran = _gated_queue(open_at)
    for i in range(3):
        q.submit(lambda i=i: ran.append((i, time.monotonic())))
    time.sleep(0.15)
    assert ran == [], "ran while the gate was closed"
    assert q.flush(timeout=5)
    assert [i for i, _ in ran] == [0, 1, 2]


def test_flush_overrides_the_gate():
    open_at = [time.monotonic() + 3600]  # closed for an hour
    q, ran = _gated_queue(open_at)
    q.submit(lambda: ran.append(1))
    t0 = time.monotonic()
    assert q.flush(timeout=5) and ran == [1]
    assert time.monotonic() - t0 < 2


def test_the_gate_opening_lets_pending_calls_run_without_a_flush():
    open_at = [time.monotonic() + 3600]
    q, ran = _gated_queue(open_at)
    done = threading.Event()
    q.submit(lambda: (ran.append(1), done.set()))
    time.sleep(0.1)
    assert not done.is_set()
    open_at[0] = time.monotonic()  # the gate opens: the idle writer notices within its poll
    assert done.wait(timeout=3)


def test_an_ungated_queue_runs_at_once():
    q = SerialQueue("test-plain")
    done = threading.Event()
    q.submit(done.set)
    assert done.wait(timeout=2)


def test_the_writer_thread_does_not_keep_its_service_alive(llama3_tokenizer, tmp_path):
    import gc
    import weakref

    from corral.grammar import ConstraintSpec
    from corral.schema_cache import CacheConfig, CompileService

    service = CompileService(llama3_tokenizer, CacheConfig(root=tmp_path))
    service.get_or_compile(ConstraintSpec.regex("ab+c"))
    service.close()
    ref = weakref.ref(service)
    del service
    gc.collect()
    assert ref() is None
