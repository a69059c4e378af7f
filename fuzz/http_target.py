"""A URL target: a server fuzzed through the requests its users send, in one dialect.

The dialect (:mod:`corral.fuzz.dialects`) says how a schema is sent (OpenAI's
``response_format``, llama.cpp's ``json_object`` + ``schema``, Ollama's ``format``, vLLM's
``structured_outputs``, SGLang's ``/generate``, a forced tool call), how the output is read back
and how the server refuses; ``auto`` probes the endpoint once at start and picks one.

Only what a client can see is checked: every completed output must be valid JSON that the judge
accepts (soundness); a refusal (as the dialect knows it) is honest, not a finding; any other
failure is an error; no answer within the timeout is a hang. Outputs cut off by ``max_tokens``
are not judged, and a schema none of whose outputs was judged counts as not judged. An unsound
output is shrunk with the judge alone (the output is the server's evidence, so only the schema
shrinks and parts of the output are taken as they are), the keyword it breaks is named, and the
shrunk schema is sent again to see whether the server still breaks it. Requests run on a
private event loop with a concurrency cap and an optional rate limit.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import httpx

from corral.fuzz import case as K
from corral.fuzz.case import Case, CaseResult, Failure, TargetOutcome
from corral.fuzz.casework import open_case
from corral.fuzz.dialects import AUTO, DIALECTS, auto
from corral.fuzz.dialects.base import (
    ALL_CUT,
    HANG,
    LENGTH,
    NO_ANSWER,
    OK,
    REFUSED,
    WRONG_CALL,
    Dialect,
    EndpointError,
    Reply,
    Sampling,
)
from corral.fuzz.judge import Judge, judge_output, schema_keywords
from corral.fuzz.shrinkwork import shrink_output

__all__ = ["EndpointError", "HttpConfig", "HttpTarget", "api_base", "server_root"]

PROMPT_SCHEMA_CHARS = 2000  # the constraint does the work; a long prompt only slows the model


@dataclass(frozen=True)
class HttpConfig:
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    concurrency: int = 4
    rate: float = 0.0  # requests per second; 0 means no limit
    samples: int = 2  # completions per schema
    max_tokens: int = 256
    temperature: float = 1.0
    timeout_s: float = 120.0
    dialect: str = AUTO  # a name in DIALECTS, or auto: probe the endpoint once
    shrink: bool = True  # shrink unsound findings and send the shrunk schema again
    shrink_seconds: float = 3.0


class _RateLimiter:
    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self._interval:
            return
        async with self._lock:
            now = time.monotonic()
            if self._next > now:
                await asyncio.sleep(self._next - now)
            self._next = max(now, self._next) + self._interval


def api_base(url: str) -> str:
    """The OpenAI-style base: the URL ending in ``/v1``."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def server_root(url: str) -> str:
    """The server's root: the URL without a trailing ``/v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class HttpTarget:
    """Call :meth:`start` once, then :meth:`submit` cases from any thread, :meth:`close` last."""

    def __init__(self, url: str, cfg: HttpConfig) -> None:
        if cfg.dialect != AUTO and cfg.dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {cfg.dialect!r}: use auto, {', '.join(DIALECTS)}")
        self.name = url
        self.cfg = cfg
        self.model = cfg.model
        self.dialect: Dialect | None = None
        self.choice = ""  # how the dialect was chosen (auto), for the report
        self._models: dict[str, str | None] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        """Open the client and settle the dialect and the model (:class:`EndpointError` if the
        endpoint cannot be used)."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._prepare(), self._loop).result()

    async def _prepare(self) -> None:
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        self._client = httpx.AsyncClient(timeout=self.cfg.timeout_s, headers=headers)
        self._sem = asyncio.Semaphore(max(1, self.cfg.concurrency))
        self._rate = _RateLimiter(self.cfg.rate)
        if self.cfg.dialect == AUTO:
            choice = await auto.choose(self)
            self.dialect, self.model, self.choice = choice.dialect, choice.model, choice.note()
        else:
            self.dialect = DIALECTS[self.cfg.dialect]
            self.model = await self.model_for(self.dialect)

    def base(self, d: Dialect) -> str:
        return api_base(self.name) if d.under_v1 else server_root(self.name)

    async def model_for(self, d: Dialect) -> str | None:
        """``--model``, else the first model the dialect's listing names (None where the
        dialect needs none)."""
        if self.cfg.model or d.models_path is None:
            return self.cfg.model
        url = self.base(d) + d.models_path
        if url not in self._models:
            assert self._client is not None
            try:
                r = await self._client.get(url)
                r.raise_for_status()
                self._models[url] = d.first_model(r.json())
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
                raise EndpointError(
                    f"cannot list models at {url} ({type(e).__name__}: {e}); "
                    "is the server up? pass --model to skip this"
                ) from e
        return self._models[url]

    async def post(self, d: Dialect, body: dict) -> Reply:
        reply, _ = await self._post(d, body)
        return reply

    async def _post(self, d: Dialect, body: dict) -> tuple[Reply, float]:
        """One request in dialect ``d``: its reply and seconds (0 when none came)."""
        assert self._client is not None
        async with self._sem:
            await self._rate.wait()
            t0 = time.monotonic()
            try:
                r = await self._client.post(self.base(d) + d.path, json=body)
            except httpx.TimeoutException:
                return Reply(HANG, f"{NO_ANSWER} {self.cfg.timeout_s:.0f} s"), 0.0
            except httpx.HTTPError as e:
                return Reply(K.ERROR, f"request failed: {type(e).__name__}: {e}"), 0.0
            dt = time.monotonic() - t0
        return d.read(r.status_code, r.text), dt

    @property
    def config(self) -> dict[str, Any]:
        """What the report prints for this target: the endpoint and how it is asked."""
        c, d = self.cfg, self.dialect
        assert d is not None, "start() settles the dialect"
        return {
            "endpoint": self.base(d) + d.path,
            "model": self.model,
            "dialect": d.name,
            "constrained by": d.describe,
            **({"chosen": self.choice} if self.choice else {}),
            "samples": c.samples,
            "temperature": c.temperature,
            "max_tokens": c.max_tokens,
        }

    def submit(self, case: Case) -> Future:
        return asyncio.run_coroutine_threadsafe(self._run(case), self._loop)

    def close(self) -> None:
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _run(self, case: Case) -> CaseResult:
        result, judge = open_case(case)
        if judge is None:
            return result
        out = result.outcomes[self.name] = TargetOutcome(self.name)
        n = self.cfg.samples
        samples = await asyncio.gather(
            *(self._sample(case.schema, case.seed + i, case.prompt) for i in range(n))
        )
        out.compile_s = min((s for r, s in samples if r.kind == OK), default=0.0)
        for reply, _ in samples:
            out.walks[reply.kind] = out.walks.get(reply.kind, 0) + 1
            if reply.kind == OK:
                self._judge(case, judge, reply.text, out)
            elif reply.kind == WRONG_CALL:
                _add(out, case, K.UNSOUND, None, reply.text)
            elif reply.kind in (K.ERROR, HANG):
                out.status, out.reason = reply.kind, reply.text
                _add(out, case, reply.kind, None, reply.text)
        out.judged = out.walks.get(OK, 0) > 0
        if out.status == "ok" and out.walks.get(REFUSED) == n:
            out.status, out.reason = REFUSED, samples[0][0].text
        elif not out.judged and out.walks.get(LENGTH) == n:
            out.reason = f"{ALL_CUT} ({self.cfg.max_tokens})"
        elif not out.judged and not out.reason:  # refusals and cut outputs, mixed
            seen = ", ".join(f"{v} {k}" for k, v in sorted(out.walks.items()))
            out.reason = f"no output could be judged ({seen}): {samples[0][0].text}"
        for f in out.failures:
            if f.kind == K.UNSOUND and f.text is not None and self.cfg.shrink:
                await asyncio.to_thread(shrink_output, f, self.cfg.shrink_seconds)
                if f.shrunk:
                    await self._send_again(f, case.prompt)
        return result

    async def _sample(self, schema: Any, seed: int, prompt: str = "") -> tuple[Reply, float]:
        assert self.dialect is not None, "start() settles the dialect"
        c = self.cfg
        sampling = Sampling(c.temperature, c.max_tokens, seed)
        body = self.dialect.body(self.model, _messages(schema, prompt), schema, sampling)
        return await self._post(self.dialect, body)

    async def _send_again(self, f: Failure, prompt: str) -> None:
        """Send the shrunk schema ``samples`` times; note how many answers broke it."""
        n, judge = self.cfg.samples, Judge(f.schema)
        replies = await asyncio.gather(*(self._sample(f.schema, i, prompt) for i in range(n)))
        bad = 0
        for reply, _ in replies:
            judged = judge_output(judge, reply.text.encode()) if reply.kind == OK else None
            bad += reply.kind == WRONG_CALL or bool(judged and judged[1])
        f.reproduced = f"{bad} of {n} answers to the shrunk schema were invalid"

    def _judge(self, case: Case, judge: Judge, content: str, out: TargetOutcome) -> None:
        judged = judge_output(judge, content.encode())
        problem = judged[1] if judged is not None else ""
        if problem:
            out.walks["invalid"] = out.walks.get("invalid", 0) + 1
            detail = f"the server returned an invalid instance: {problem}"
            _add(out, case, K.UNSOUND, content, detail)


def _messages(schema: Any, prompt: str = "") -> list[dict[str, str]]:
    text = json.dumps(schema, ensure_ascii=False)[:PROMPT_SCHEMA_CHARS]
    ask = f"Write a JSON value that matches this JSON Schema:\n{text}"
    return [
        {"role": "system", "content": "You reply with one JSON value and nothing else."},
        {"role": "user", "content": f"{prompt}\n\n{ask}" if prompt else ask},
    ]


def _add(out: TargetOutcome, case: Case, kind: str, text: str | None, detail: str) -> None:
    if kind not in out.kinds():
        f = case.failure(out.target, kind, text, detail)
        f.keywords = tuple(sorted(schema_keywords(f.schema)))
        out.failures.append(f)
