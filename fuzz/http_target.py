"""A URL target: any OpenAI-compatible server, fuzzed through its chat completions.

The schema constrains the output one of two ways (``HttpConfig.via``): ``response_format``
(``json_schema``, strict) judges the message content; ``tools`` makes the schema the
``parameters`` of the one function the request names in ``tool_choice`` and judges the call's
``arguments`` (an answer without that call, or with another, is unsound: the server broke the
tool choice).

Only what a client can see is checked: every completed output must be valid JSON that the judge
accepts (soundness); a 4xx answer is the server refusing the schema; a 5xx or a broken connection
is an error; no answer within the timeout is a hang. Outputs cut off by ``max_tokens`` are not
judged. Requests run on a private event loop with a concurrency cap and an optional rate limit.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import httpx

from corral.fuzz import case as K
from corral.fuzz.case import Case, CaseResult, TargetOutcome
from corral.fuzz.casework import open_case
from corral.fuzz.judge import Judge, judge_output, schema_keywords

PROMPT_SCHEMA_CHARS = 2000  # the constraint does the work; a long prompt only slows the model
TOOL_NAME = "fuzz_call"


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
    via: str = "response_format"  # or "tools": the schema is a function's parameters


class EndpointError(RuntimeError):
    """The endpoint cannot be used at all (unreachable, or it lists no model)."""


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
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class HttpTarget:
    """Call :meth:`start` once, then :meth:`submit` cases from any thread, :meth:`close` last."""

    def __init__(self, url: str, cfg: HttpConfig) -> None:
        self.name = url
        self.base = api_base(url)
        self.cfg = cfg
        self.model = cfg.model
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._prepare(), self._loop).result()

    async def _prepare(self) -> None:
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        self._client = httpx.AsyncClient(timeout=self.cfg.timeout_s, headers=headers)
        self._sem = asyncio.Semaphore(max(1, self.cfg.concurrency))
        self._rate = _RateLimiter(self.cfg.rate)
        if self.model:
            return
        try:
            r = await self._client.get(f"{self.base}/models")
            r.raise_for_status()
            self.model = r.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            raise EndpointError(
                f"cannot list models at {self.base}/models ({e}); "
                f"is the server up? pass --model to skip this"
            ) from e

    @property
    def config(self) -> dict[str, Any]:
        """What the report prints for this target: the endpoint and how it is asked."""
        c = self.cfg
        return {
            "endpoint": self.base,
            "model": self.model,
            "constrained by": _VIA_TEXT[c.via],
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
        samples = await asyncio.gather(*(self._sample(case, i) for i in range(self.cfg.samples)))
        times = [s for kind, _, s in samples if kind == "ok"]
        out.compile_s = min(times, default=0.0)
        for kind, payload, _ in samples:
            out.walks[kind] = out.walks.get(kind, 0) + 1
            if kind == "ok":
                self._judge(case, judge, payload, out)
            elif kind == "wrong-call":
                _add(out, case, K.UNSOUND, None, payload)
            elif kind in (K.ERROR, K.HANG):
                out.status = kind
                _add(out, case, kind, None, payload)
        if out.status == "ok" and out.walks.get("refused") == self.cfg.samples:
            out.status, out.reason = "refused", samples[0][1]
        return result

    def _judge(self, case: Case, judge: Judge, content: str, out: TargetOutcome) -> None:
        judged = judge_output(judge, content.encode())
        problem = judged[1] if judged is not None else ""
        if problem:
            out.walks["invalid"] = out.walks.get("invalid", 0) + 1
            detail = f"the server returned an invalid instance: {problem}"
            _add(out, case, K.UNSOUND, content, detail)

    async def _sample(self, case: Case, i: int) -> tuple[str, str, float]:
        """One completion: ``(kind, content or reason, seconds)``.

        ``kind`` is ok, length, refused, error, hang or wrong-call (``via`` tools: the answer
        did not call the named function exactly once)."""
        body = {
            "model": self.model,
            "messages": _messages(case),
            **_constraint(self.cfg.via, case.schema),
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
            "seed": case.seed + i,
        }
        assert self._client is not None
        async with self._sem:
            await self._rate.wait()
            t0 = time.monotonic()
            try:
                r = await self._client.post(f"{self.base}/chat/completions", json=body)
            except httpx.TimeoutException:
                return K.HANG, f"no answer within {self.cfg.timeout_s:.0f} s", 0.0
            except httpx.HTTPError as e:
                return K.ERROR, f"request failed: {type(e).__name__}: {e}", 0.0
            dt = time.monotonic() - t0
        if 400 <= r.status_code < 500:
            return "refused", f"HTTP {r.status_code}: {r.text[:300]}", dt
        if r.status_code != 200:
            return K.ERROR, f"HTTP {r.status_code}: {r.text[:300]}", dt
        try:
            choice = r.json()["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            return K.ERROR, f"not an OpenAI chat completion: {r.text[:300]}", dt
        if choice.get("finish_reason") == "length":
            return "length", "", dt
        if self.cfg.via == "response_format":
            return "ok", message.get("content") or "", dt
        return (*_arguments(message), dt)


_VIA_TEXT = {
    "response_format": "response_format json_schema, strict true",
    "tools": f"tool_choice naming one function ({TOOL_NAME}, strict true) whose parameters "
    "are the schema; its arguments are judged",
}


def _constraint(via: str, schema: object) -> dict[str, object]:
    """The request fields that constrain the output to ``schema``."""
    if via == "response_format":
        rf = {
            "type": "json_schema",
            "json_schema": {"name": "fuzz", "schema": schema, "strict": True},
        }
        return {"response_format": rf}
    function = {"name": TOOL_NAME, "description": "Call with arguments that match the schema",
                "parameters": schema, "strict": True}  # fmt: skip
    return {
        "tools": [{"type": "function", "function": function}],
        "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}},
        "parallel_tool_calls": False,
    }


def _arguments(message: dict) -> tuple[str, str]:
    """``("ok", arguments)`` of the one call to the named function; anything else is unsound."""
    calls = message.get("tool_calls") or []
    if len(calls) != 1 or (calls[0].get("function") or {}).get("name") != TOOL_NAME:
        names = [(c.get("function") or {}).get("name") for c in calls]
        return "wrong-call", (
            f"tool_choice named {TOOL_NAME} but the answer called {names or 'no function'} "
            f"(content: {str(message.get('content'))[:200]!r})"
        )
    return "ok", calls[0]["function"].get("arguments") or ""


def _messages(case: Case) -> list[dict[str, str]]:
    text = case.schema_json[:PROMPT_SCHEMA_CHARS]
    return [
        {"role": "system", "content": "You reply with one JSON value and nothing else."},
        {"role": "user", "content": f"Write a JSON value that matches this JSON Schema:\n{text}"},
    ]


def _add(out: TargetOutcome, case: Case, kind: str, text: str | None, detail: str) -> None:
    if kind not in out.kinds():
        f = case.failure(out.target, kind, text, detail)
        f.keywords = tuple(sorted(schema_keywords(f.schema)))
        out.failures.append(f)
