"""Load with disconnects against a real `corral serve`: bursts of judged requests (`fuzz/load.py`).

64 concurrent streaming `json_schema` requests of which a third hang up at random points, then
64 non-streaming ones: every output that ends with "stop" validates, none is lost or stuck, no
5xx or error event, and afterwards nothing is held (admission, running sequences, KV slots outside
the prefix cache) and the server's RSS is within 10% of what it was before.
"""

from __future__ import annotations

import pytest
from api_server import start_server, stop_server

from corral.fuzz import load

N = 64


@pytest.fixture(scope="module")
def busy_server(model_folder, tmp_path_factory):
    flags = ("--max-concurrent", "16", "--queue-limit", "128", "--memory", "512MB")
    srv = start_server(model_folder, tmp_path_factory.mktemp("corral-load"), flags)
    yield srv
    stop_server(srv)


def test_load_with_disconnects_loses_nothing_and_leaks_nothing(busy_server) -> None:
    s = busy_server
    # a first small round allocates what a server allocates once (buffers, compiled schemas)
    warm = load.round_of_waves(s.url, s.api_key, s.model, 16, seed=100, max_tokens=40)
    assert not warm.failures and not warm.stuck, warm.failures[:5]
    assert load.wait_for_baseline(s.url) == dict.fromkeys(load.request_held({}), 0)
    rss_before = load.rss_bytes(s.proc.pid)

    tally = load.round_of_waves(s.url, s.api_key, s.model, N, seed=0, max_tokens=40)
    print("load:", tally.line())

    assert tally.failures == [], tally.failures[:10]
    assert tally.stuck == 0
    finished = sum(tally.outcomes[k] for k in ("stop", "length"))
    assert finished + tally.outcomes["disconnected"] == 2 * N  # every request accounted for
    assert tally.outcomes["disconnected"] > 0 and tally.outcomes["stop"] > N
    held = load.wait_for_baseline(s.url)
    assert held == dict.fromkeys(held, 0), held
    rss_after = load.rss_bytes(s.proc.pid)
    assert rss_after <= rss_before * 1.10, (rss_before, rss_after)
    assert s.proc.poll() is None
