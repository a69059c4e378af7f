"""OpenAI-compatible server processes under test: started pinned to cores, streamed with the
client's clock at each chunk, and their peak memory. `bench/cpu_peers.py` drives Corral and
llama.cpp's server through this module.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx


@dataclass
class Reply:
    """One streamed completion, with the client's clock at each point."""

    sent: float
    content: str = ""
    finish: str | None = None
    first: float | None = None  # the first chunk with content
    end: float | None = None  # the chunk with the finish reason (the EOS is sampled by then)
    chunks: int = 0  # content chunks
    usage: int | None = None  # completion tokens, where the server streams its usage
    prompt_tokens: int | None = None
    speculative: dict | None = None  # Corral's usage extension (prompt-lookup drafts)

    @property
    def tokens(self) -> int:
        """Tokens generated, the EOS included: Corral's usage, else llama.cpp's content chunks
        (its stream sends one per token; a character split over tokens comes in one) + EOS."""
        return self.usage if self.usage is not None else self.chunks + (self.finish == "stop")

    def decode_rate(self) -> float | None:
        if self.tokens < 2 or self.first is None or self.end is None or self.end <= self.first:
            return None
        return (self.tokens - 1) / (self.end - self.first)


@dataclass
class Server:
    """A server process under test, and how its requests are written."""

    name: str
    proc: subprocess.Popen
    url: str
    log: IO[str]
    command: list[str]
    model: str = ""
    constrained: list[Reply] = field(default_factory=list)  # figures 2 and 3, for figure 6

    @property
    def is_corral(self) -> bool:
        return self.name == "Corral"

    def body(self, prompt: str, max_tokens: int, schema: dict | None) -> dict:
        req = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        if self.is_corral:
            req["stream_options"] = {"include_usage": True}
            if schema:
                req["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "event", "strict": True, "schema": schema},
                }
        else:
            req["repeat_penalty"] = 1.0
            if schema:
                req["response_format"] = {"type": "json_object", "schema": schema}
        return req

    def tail(self, n: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read()[-n:]


def start(
    name: str, command: list[str], url: str, cores: set[int], timeout_s: float
) -> Server | None:
    """Spawn a server on `cores` and wait for /v1/models; None (with its output) if it fails."""
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )
    server = Server(name, proc, url, log, command)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            r = httpx.get(url + "/v1/models", timeout=5)
            if r.status_code == 200:
                server.model = r.json()["data"][0]["id"]
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    print(f"{name} did not start (exit code {proc.poll()}); its output ends with:\n{server.tail()}")
    stop(server)
    return None


def stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


async def stream(client: httpx.AsyncClient, req: dict) -> Reply:
    reply = Reply(sent=time.perf_counter())
    async with client.stream("POST", "/v1/chat/completions", json=req) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            now = time.perf_counter()
            if usage := chunk.get("usage"):
                reply.usage, reply.prompt_tokens = (
                    usage["completion_tokens"],
                    usage["prompt_tokens"],
                )
                reply.speculative = usage.get("speculative")
            for choice in chunk.get("choices", []):
                text = (choice.get("delta") or {}).get("content")
                if text is not None and (text or reply.first is not None):
                    reply.first, reply.end = reply.first or now, now
                    reply.content += text
                    reply.chunks += 1
                if choice.get("finish_reason"):
                    reply.finish, reply.end = choice["finish_reason"], now
    return reply


async def batch(
    server: Server, prompts: list[str], max_tokens: int, schema: dict | None, concurrency: int
) -> tuple[list[Reply], float]:
    """Stream `prompts`, `concurrency` at a time: the replies and the wall time of all."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=server.url, timeout=1800, limits=limits) as client:

        async def one(prompt: str) -> Reply:
            async with sem:
                return await stream(client, server.body(prompt, max_tokens, schema))

        t0 = time.perf_counter()
        replies = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - t0
    if schema:
        server.constrained += replies
    return list(replies), wall


def peak_rss_mib(pid: int) -> tuple[float, float]:
    """VmHWM of `pid`, and summed over it and its descendants (each process's own peak)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    hwm = [_hwm_kib(p) for p in tree]
    return hwm[0] / 1024, sum(hwm) / 1024


def _hwm_kib(pid: int) -> int:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(x.split()[1]) for x in lines if x.startswith("VmHWM:")), 0)
