"""AsyncEngine: streamed deltas add up to the synchronous result; abort and errors."""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import chat

from corral.engine import AsyncEngine, Engine, EngineConfig, RequestError, SamplingParams

CONFIG = EngineConfig(num_threads=1)


async def collect(engine: AsyncEngine, prompt, params, **kw):
    outs = [out async for out in engine.generate(prompt, params, **kw)]
    return outs


def test_stream_matches_sync_and_abort_frees(smollm2):
    prompts = [chat(smollm2, q) for q in ("Name a color.", "Tell me a story about a llama.")]
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=True)
    ref = Engine(smollm2, CONFIG).generate(prompts, params)

    async def main():
        engine = AsyncEngine(smollm2, CONFIG)
        await engine.start()
        try:
            streams = await asyncio.gather(*(collect(engine, p, params) for p in prompts))
            long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
            gen = engine.generate(prompts[1], long, request_id="to-abort")
            first = await gen.__anext__()
            engine.abort("to-abort")
            rest = [o async for o in gen]
            with pytest.raises(RequestError):
                await collect(engine, [], params)
            stats = engine.stats()
        finally:
            await engine.stop()
        return streams, first, rest, stats, engine

    streams, first, rest, stats, engine = asyncio.run(main())
    for outs, choices in zip(streams, ref, strict=True):
        assert outs[-1].finish_reason == choices[0].finish_reason
        assert all(o.finish_reason is None for o in outs[:-1])
        assert "".join(o.text for o in outs) == choices[0].text
        assert [t for o in outs for t in o.token_ids] == choices[0].token_ids
        assert len([lp for o in outs for lp in o.logprobs]) == len(choices[0].token_ids)
    assert first.finish_reason is None
    assert rest[-1].finish_reason == "abort"
    assert len(first.token_ids) + sum(len(o.token_ids) for o in rest) < 200
    assert {"waiting", "running", "kv_usage", "radix_hit_tokens"} <= set(stats)
    engine.engine.check_integrity()
    assert not engine.engine.live_sequences()


def test_consumer_leaving_early_aborts(smollm2):
    prompt = chat(smollm2, "Count from one to one hundred.")

    async def main():
        engine = AsyncEngine(smollm2, CONFIG)
        await engine.start()
        try:
            params = SamplingParams(max_tokens=100, temperature=0, n=2, ignore_eos=True)
            async for _ in engine.generate(prompt, params):
                break  # the client went away
            for _ in range(200):
                await asyncio.sleep(0.01)
                if engine.stats()["running"] == 0 and engine.stats()["waiting"] == 0:
                    break
        finally:
            await engine.stop()
        return engine

    engine = asyncio.run(main())
    assert engine.engine.counters["aborted"] == 2
    engine.engine.check_integrity()
    assert not engine.engine.live_sequences()
