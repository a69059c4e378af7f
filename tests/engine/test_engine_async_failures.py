"""AsyncEngine under failure: a failed step restarts the loop, requests in flight end with
"engine_restarted", health tells the truth, new requests are served and nothing leaks; a caller
cancelled before acceptance leaves nothing running; gauges follow aborts."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from engine_helpers import chat

from corral.engine import AsyncEngine, EngineConfig, RequestError, SamplingParams
from corral.grammar import ConstraintSpec, compile_constraint

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "pop": {"type": "integer"}},
    "required": ["city", "pop"],
    "additionalProperties": False,
}
LONG = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)


async def collect(engine: AsyncEngine, prompt, params, constraint=None):
    return [out async for out in engine.generate(prompt, params, constraint)]


async def until(predicate, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def settled(engine: AsyncEngine) -> None:
    eng = engine.engine
    eng.check_integrity()
    assert not eng.live_sequences()
    assert eng.pool.num_free + eng.cache.radix.total_size == eng.pool.capacity
    assert eng.cache.radix.protected_size == 0


def states(engine: AsyncEngine) -> list[str]:
    return [state for _, state in engine.health_log]


def run_restart(smollm2, tokinfo, leak: int):
    """Three requests in flight when step 3 raises; `leak` slots taken behind the engine's back
    first, so that the reset finds a leak and the engine must be rebuilt."""
    city = compile_constraint(ConstraintSpec.json_schema(SCHEMA), tokinfo)
    prompts = [chat(smollm2, q) for q in ("A city as JSON.", "Count to fifty.", "Name a river.")]

    async def main():
        engine = AsyncEngine(smollm2, EngineConfig(num_threads=1, faults="step@3"), None)
        assert engine.health() == "starting" and not engine.ready
        await engine.start()
        first = engine.engine
        try:
            if leak:
                assert first.pool.alloc(leak) is not None  # the loop is idle: nothing races
            flight = await asyncio.gather(
                collect(engine, prompts[0], SamplingParams(max_tokens=40, temperature=0), city),
                collect(engine, prompts[1], SamplingParams(max_tokens=50, temperature=0, n=2)),
                collect(engine, prompts[2], LONG),
            )
            await until(lambda: engine.ready)
            after = await collect(
                engine, prompts[0], SamplingParams(max_tokens=40, temperature=0), city
            )
            settled(engine)
        finally:
            await engine.stop()
        return engine, first, flight, after

    return asyncio.run(main())


@pytest.mark.parametrize("leak", [0, 3], ids=["reset", "rebuild"])
def test_failed_step_restarts_the_loop(smollm2, tokinfo, leak):
    engine, first, flight, after = run_restart(smollm2, tokinfo, leak)
    finals = [o for outs in flight for o in outs if o.finish_reason is not None]
    assert len(finals) == 4  # one per live choice, delivered as outputs, not exceptions
    for out in finals:
        assert out.finish_reason == "error"
        assert out.error.code == "engine_restarted"
        assert "step@3" in out.error.message
    assert states(engine)[:4] == ["starting", "ok", "restarting", "ok"]
    assert engine.restarts == 1 and engine.stats()["engine_restarts"] == 1
    assert (engine.engine is first) == (leak == 0)
    assert after[-1].finish_reason == "stop" and after[-1].error is None
    jsonschema.validate(json.loads("".join(o.text for o in after)), SCHEMA)


def test_cancelled_before_acceptance_aborts(smollm2):
    prompt = chat(smollm2, "Count from one to one hundred.")

    async def main():
        engine = AsyncEngine(smollm2, EngineConfig(num_threads=1))
        await engine.start()
        try:
            task = asyncio.create_task(collect(engine, prompt, LONG))
            await asyncio.sleep(0)  # the task is now waiting for the engine to accept it
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: engine.engine.counters["aborted"] == 1)
            await until(lambda: engine.stats()["running"] == engine.stats()["waiting"] == 0)
            settled(engine)
            return engine.engine.counters["output_tokens"]
        finally:
            await engine.stop()

    assert asyncio.run(main()) < LONG.max_tokens


def test_gauges_follow_an_abort_without_another_request(smollm2):
    prompt = chat(smollm2, "Tell me a long story.")

    async def main():
        engine = AsyncEngine(smollm2, EngineConfig(num_threads=1))
        await engine.start()
        try:
            async for _ in engine.generate(prompt, LONG):
                assert engine.stats()["running"] == 1
                break  # the client disconnected
            await until(lambda: engine.stats()["running"] == 0, timeout_s=5)
            assert engine.stats()["kv_usage"] < 1
        finally:
            await engine.stop()

    asyncio.run(main())


def test_foreign_constraint_is_refused_and_serving_goes_on(smollm2, tokinfo, llama3_tokenizer):
    foreign = compile_constraint(ConstraintSpec.json_schema(SCHEMA), llama3_tokenizer)
    city = compile_constraint(ConstraintSpec.json_schema(SCHEMA), tokinfo)
    prompt = chat(smollm2, "A city as JSON.")

    async def main():
        engine = AsyncEngine(
            smollm2, EngineConfig(num_threads=1), tokenizer_fingerprint=tokinfo.fingerprint
        )
        await engine.start()
        try:
            with pytest.raises(RequestError, match="another tokenizer"):
                await collect(engine, prompt, SamplingParams(max_tokens=8), foreign)
            outs = await collect(engine, prompt, SamplingParams(max_tokens=64, temperature=0), city)
            assert engine.health() == "ok" and engine.restarts == 0
            settled(engine)
        finally:
            await engine.stop()
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(o.text for o in outs)), SCHEMA)


def test_stop_ends_running_requests_with_engine_stopped(smollm2):
    prompt = chat(smollm2, "Tell me a long story.")

    async def main():
        engine = AsyncEngine(smollm2, EngineConfig(num_threads=1))
        await engine.start()
        gen = engine.generate(prompt, LONG)
        first = await gen.__anext__()
        await engine.stop()
        rest = [o async for o in gen]
        return engine, first, rest

    engine, first, rest = asyncio.run(main())
    assert first.finish_reason is None
    assert rest[-1].finish_reason == "error" and rest[-1].error.code == "engine_stopped"
    assert engine.health() == "down"
