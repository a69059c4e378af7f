"""Corral against llama.cpp on the CPU: one GGUF, the same cores, prompts and greedy decoding.

Both servers are started once, pinned to the same ``--threads`` cores (Corral sizes its torch
threads from its CPU affinity; llama.cpp gets ``--n_threads`` and ``--n_threads_batch``), warmed
with one request each, and measured one at a time, Corral then llama.cpp in every round; each
figure is the median of its rounds. Every request is streamed and greedy (temperature 0):

1. decode tok/s, one request at a time, 8 chat prompts (``max_tokens`` 96): per request
   (tokens generated - 1) / (time of its last token - time of its first), the median;
2. the same under a strict ``json_schema`` (an event object with typed, bounded fields);
3. aggregate tok/s with 8 requests at once, unconstrained and constrained: tokens / wall time;
4. time to the first token of a ~1,000-token prompt (a new prompt each round);
5. peak RSS (VmHWM) of each server: its main process, and with its child processes;
6. the share of constrained outputs (2 and 3) that are instances of the schema (jsonschema,
   Draft 2020-12); an output cut by ``max_tokens`` is invalid and also counted apart.

llama-cpp-python's server takes a schema as ``{"type": "json_object", "schema": ...}`` (it
refuses OpenAI's ``json_schema`` type), so it gets the same schema in that form, and
``repeat_penalty: 1.0`` (its default is 1.1). Its server runs with ``--interrupt_requests False``
(by default a new request cuts the one streaming) and ``--logits_all False`` (by default it
computes the logits of every prompt token). Tokens generated count the EOS: Corral's are its
streamed usage; llama.cpp streams no usage but one chunk per token, so its are its content
chunks, plus the EOS when it stopped; the last token's time is that of the chunk with the finish
reason. Without llama-cpp-python (``pip install -e '.[peers]'``, built from source) the bench prints
Corral's figures alone.

``--model`` takes any GGUF, or the name of a model the bench writes and caches
(``qwen3-1b-q4_k_m``: a 1B Qwen3-shaped Q4_K_M-style file of random weights,
``bench/generated_models.py``); ``--only chat,chat-batch`` measures some figures only.

    .venv/bin/python -m bench.cpu_peers [--quick] [--model PATH|NAME] [--only FIGURES]
        [--corral-arg=--dtype=bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import jsonschema

from bench.generated_models import GENERATED, generated_model
from bench.peer_servers import Reply, Server, batch, peak_rss_mib, start, stop
from bench.provenance import free_port, header

FIGURES = ("chat", "json", "chat-batch", "json-batch", "ttft")
CHATS = (
    "Explain why the sky is blue.",
    "Write a short poem about the sea.",
    "Give three tips for someone learning to cook.",
    "What is the difference between a virus and a bacterium?",
    "Describe a busy train station in the morning.",
    "How does a bicycle stay upright?",
    "Write a short story about a lost key.",
    "List some creative uses for a paperclip.",
)
EVENTS = tuple(
    f"{p} Answer as JSON with name, date, city, attendees, ticketed and topics."
    for p in (
        "Invent a technology conference in Europe.",
        "Describe a small-town summer music festival.",
        "Make up a charity marathon.",
        "Invent a science fair for schools.",
        "Describe a cooking class for beginners.",
        "Make up a chess tournament.",
        "Invent the opening night of an art exhibition.",
        "Describe a company's annual general meeting.",
    )
)
SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["name", "date", "city", "attendees", "ticketed", "topics"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 32},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "city": {"type": "string", "minLength": 1, "maxLength": 24},
        "attendees": {"type": "integer", "minimum": 1, "maximum": 100000},
        "ticketed": {"type": "boolean"},
        "topics": {"type": "array", "minItems": 1, "maxItems": 2,
                   "items": {"type": "string", "minLength": 1, "maxLength": 16}},
    },
}  # fmt: skip
WORDS = (
    "the river town market morning council library winter harvest bridge school road old new "
    "small people family water light stone field garden north south letter history report "
    "season price bread train station doctor teacher children village mountain forest rain "
    "summer museum painting music evening festival workers factory year century city record"
).split()


def long_prompt(k: int, words: int) -> str:
    """A ~1,000-token document (about 1.15 tokens a word), different from its first word on."""
    rng = random.Random(k)
    sentences, n = [], 0
    while n < words:
        s = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        sentences.append(" ".join(s).capitalize() + ".")
        n += len(s)
    return f"Record {k}. " + " ".join(sentences) + "\n\nSummarise the record above in one line."


def ttft(server: Server, k: int, words: int) -> tuple[float, int]:
    """Seconds to the first token of a new long prompt, and its prompt tokens."""
    replies, _ = asyncio.run(batch(server, [long_prompt(k, words)], 8, None, 1))
    reply = replies[0]
    if reply.prompt_tokens is None:  # llama.cpp: the same request unstreamed (its KV is reused)
        req = server.body(long_prompt(k, words), 1, None) | {"stream": False}
        r = httpx.post(server.url + "/v1/chat/completions", json=req, timeout=600)
        reply.prompt_tokens = r.json()["usage"]["prompt_tokens"]
    return reply.first - reply.sent, reply.prompt_tokens


def interleave(
    servers: list[Server], rounds: int, label: str, measure: Callable[[Server, int], float]
) -> dict[str, float | None]:
    """Each round measures every server in turn; the median per server (None: every round failed,
    each failure printed: one server's error does not end the other's figures)."""
    runs: dict[str, list[float]] = {s.name: [] for s in servers}
    for k in range(rounds):
        for s in servers:
            try:
                runs[s.name].append(measure(s, k))
                shown = f"{runs[s.name][-1]:.3f}"
            except (RuntimeError, httpx.HTTPError, statistics.StatisticsError) as e:
                shown = f"FAILED: {e}"
            print(f"  {label}, round {k + 1}, {s.name}: {shown}", flush=True)
    return {name: statistics.median(v) if v else None for name, v in runs.items()}


def median_rate(replies: list[Reply]) -> float:
    rates = [r.decode_rate() for r in replies]
    return statistics.median(x for x in rates if x is not None)


def aggregate(replies: list[Reply], wall: float) -> float:
    return sum(r.tokens for r in replies) / wall


def validity(replies: list[Reply]) -> tuple[int, int, int, list[str]]:
    """(valid, cut by max_tokens, all, a few invalid outputs) under SCHEMA."""
    valid, cut, bad = 0, 0, []
    for r in replies:
        try:
            if r.finish == "length":
                raise ValueError("cut by max_tokens")
            jsonschema.validate(json.loads(r.content), SCHEMA, jsonschema.Draft202012Validator)
            valid += 1
        except (ValueError, jsonschema.ValidationError) as e:
            cut += r.finish == "length"
            bad.append(f"{r.content!r} ({str(e).splitlines()[0]})")
    return valid, cut, len(replies), bad[:3]


def llama_cpp_probe() -> tuple[str | None, str]:
    """llama-cpp-python's version (None if absent), and whether SCHEMA converts to its grammar:
    its server silently falls back to any JSON when the conversion fails."""
    probe = (
        "import json, sys, llama_cpp, llama_cpp.server\n"
        "from llama_cpp.llama_grammar import json_schema_to_gbnf\n"
        "print(llama_cpp.__version__)\n"
        "try:\n    json_schema_to_gbnf(sys.argv[1]); print('converts to a grammar')\n"
        "except Exception as e:\n    print(f'does NOT convert ({e!r}): any JSON instead')"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(SCHEMA)], capture_output=True, text=True
    )
    lines = r.stdout.splitlines()
    return (lines[0], lines[-1]) if r.returncode == 0 and len(lines) == 2 else (None, "")


def measure_all(servers: list[Server], args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """Figures 1-4 (medians by label and server), the prompt tokens of figure 4, the last replies."""
    n, mt, c = args.prompts, args.max_tokens, args.concurrency
    chats, events = list(CHATS[:n]), list(EVENTS[:n])
    many = lambda prompts: [prompts[i % len(prompts)] for i in range(c)]  # noqa: E731
    last: dict[tuple[str, str], list[Reply]] = {}

    def one_at_a_time(label: str, prompts: list[str], schema: dict | None) -> Callable:
        def measure(s: Server, k: int) -> float:
            last[label, s.name] = asyncio.run(batch(s, prompts, mt, schema, 1))[0]
            return median_rate(last[label, s.name])

        return measure

    def at_once(prompts: list[str], schema: dict | None) -> Callable:
        return lambda s, k: aggregate(*asyncio.run(batch(s, many(prompts), mt, schema, c)))

    prompt_tokens: dict[str, list[int]] = {s.name: [] for s in servers}

    def first_token(s: Server, k: int) -> float:
        seconds, tokens = ttft(s, k, args.prompt_words)
        prompt_tokens[s.name].append(tokens)
        return seconds

    figures = {
        "chat": one_at_a_time("chat", chats, None),
        "json": one_at_a_time("json", events, SCHEMA),
        "chat-batch": at_once(chats, None),
        "json-batch": at_once(events, SCHEMA),
        "ttft": first_token,
    }
    chosen = {label: f for label, f in figures.items() if label in args.only}
    med = {label: interleave(servers, args.rounds, label, f) for label, f in chosen.items()}
    return med, prompt_tokens, last


def cross_checks(servers: list[Server], last: dict) -> list[str]:
    """Each server's token count against llama.cpp's tokenizer on the same text; equal outputs."""
    if len(servers) < 2:
        return ["tokens: Corral's usage (no llama.cpp to compare with)"]
    count = servers[1].url + "/extras/tokenize/count"
    notes = []
    for label, s in itertools.product(("chat", "json"), servers):
        if (replies := last.get((label, s.name))) is None:
            continue
        counted = [httpx.post(count, json={"input": r.content}, timeout=60).json()["count"]
                   for r in replies]  # fmt: skip
        diffs = [r.tokens - (r.finish == "stop") - k for r, k in zip(replies, counted, strict=True)]
        notes.append(f"tokens, {label}, {s.name}: counted minus EOS minus llama.cpp's tokenizer on "
                     f"the text, last round: {diffs}")  # fmt: skip
    for label in ("chat", "json"):
        ours, theirs = last.get((label, "Corral")), last.get((label, "llama.cpp"))
        if ours and theirs:
            same = sum(a.content == b.content for a, b in zip(ours, theirs, strict=True))
            notes.append(f"identical outputs, {label}, last round: {same}/{len(ours)}")
    return notes


Row = tuple[str, list[float | None], str, float | None]  # label, values, format, bar


def rows(names: list[str], med: dict, rss: dict, ptoks: dict, c: int) -> list[Row]:
    def per(key: str) -> list[float | None]:
        return [med[key][n] if key in med else None for n in names]

    ptok = " / ".join(str(statistics.median(ptoks[n])) for n in names if ptoks[n])
    return [
        ("1. decode tok/s, 1 at a time, chat", per("chat"), ".1f", 1.0),
        ("2. decode tok/s, 1 at a time, json_schema", per("json"), ".1f", 1.2),
        (f"3. aggregate tok/s, {c} at once, chat", per("chat-batch"), ".1f", 3.0),
        (f"3. aggregate tok/s, {c} at once, json_schema", per("json-batch"), ".1f", 3.0),
        (f"4. time to first token (s), {ptok}-token prompt", per("ttft"), ".3f", None),
        ("5. peak RSS, main process (MiB)", [rss[n][0] for n in names], ".0f", None),
        ("5. peak RSS, with child processes (MiB)", [rss[n][1] for n in names], ".0f", None),
    ]


def table(table_rows: list[Row], valid: list[tuple[int, int, int, list[str]]]) -> list[str]:
    """A Markdown table; a missing peer is "—" (its ratio and verdict too)."""
    out = ["| figure | Corral | llama.cpp | Corral / llama.cpp | bar |", "|---|---|---|---|---|"]
    for label, values, fmt, bar in table_rows:
        a, b = (values + [None])[:2]
        ratio = a / b if a is not None and b else None
        verdict = "" if bar is None else f"≥ {bar:.1f}×"
        if bar is not None and ratio is not None:
            verdict += ": met" if ratio >= bar else ": **not met**"
        cells = [format(v, fmt) if v is not None else "—" for v in (a, b)]
        shown = "—" if ratio is None else f"{ratio:.2f}×"
        out.append(f"| {label} | {cells[0]} | {cells[1]} | {shown} | {verdict} |")
    share = [f"{ok}/{n} ({ok / n:.0%})" if n else "—" for ok, _, n, _ in valid] + ["—"]
    cut = [str(k) for _, k, _, _ in valid] + ["—"]
    out.append(f"| 6. constrained outputs valid per the schema | {share[0]} | {share[1]} | — | |")
    out.append(f"| 6. of the invalid, cut by max_tokens | {cut[0]} | {cut[1]} | — | |")
    return out


def commands(args: argparse.Namespace, cport: int, lport: int) -> tuple[list[str], list[str]]:
    """`corral serve` (with the pass-through arguments) and llama-cpp-python's server."""
    corral = [str(Path(sys.executable).with_name("corral")), "serve", "--model", args.gguf]
    llama = [sys.executable, "-m", "llama_cpp.server", "--model", args.gguf]
    t = args.threads
    llama += (
        f"--n_threads {t} --n_threads_batch {t} --n_ctx {args.n_ctx} --logits_all False".split()
    )
    llama += f"--interrupt_requests False --host 127.0.0.1 --port {lport}".split()
    return [*corral, "--port", str(cport), *args.corral_arg], llama


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", "--gguf", dest="gguf",
        help="a GGUF file, or a model the bench writes (bench/generated_models.py: "
        f"{', '.join(GENERATED)}); default: the embedded SmolLM2-135M-Instruct Q4_1",
    )  # fmt: skip
    ap.add_argument(
        "--only", default=",".join(FIGURES), type=lambda v: v.split(","),
        help=f"the figures to measure, of {','.join(FIGURES)} (default: all)",
    )  # fmt: skip
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="requests in figures 1 and 2")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-words", type=int, default=870, help="figure 4's prompt (~1k tokens)")
    ap.add_argument("--n-ctx", type=int, default=2048, help="llama.cpp's context")
    ap.add_argument("--corral-arg", action="append", default=[], help="passed to corral serve")
    ap.add_argument("--quick", action="store_true", help="1 round, 4 prompts")
    ap.add_argument("--start-timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.prompts = 1, 4
    if args.gguf is None:
        from corral.engine.loading.assets import default_gguf_path

        args.gguf = str(default_gguf_path())
    elif args.gguf in GENERATED:
        args.gguf = str(generated_model(args.gguf))
    if unknown := set(args.only) - set(FIGURES):
        ap.error(f"--only: unknown figures {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(header(__file__), flush=True)
    cores = set(sorted(os.sched_getaffinity(0))[: args.threads])
    version, grammar = llama_cpp_probe()
    cport, lport = free_port(), free_port()
    corral_cmd, llama_cmd = commands(args, cport, lport)
    print(f"model {args.gguf}; both servers on cores {sorted(cores)}; {args.rounds} round(s); "
          f"max_tokens {args.max_tokens}; greedy, streamed")  # fmt: skip
    print("Corral:    " + " ".join(corral_cmd))
    if version:
        print(f"llama.cpp: llama-cpp-python {version}: " + " ".join(llama_cmd))
        print(f"the schema, in llama-cpp-python's converter: {grammar}")
    else:
        print("llama.cpp: llama-cpp-python is not installed (pip install "
              "'llama-cpp-python[server]'): Corral's figures alone")  # fmt: skip
    t0 = time.monotonic()
    servers: list[Server] = []
    try:
        corral = start("Corral", corral_cmd, f"http://127.0.0.1:{cport}", cores, args.start_timeout)
        if corral is None:
            return 1
        servers.append(corral)
        if version:
            url = f"http://127.0.0.1:{lport}"
            if llama := start("llama.cpp", llama_cmd, url, cores, args.start_timeout):
                servers.append(llama)
        for s in servers:  # warm-up: one constrained request, not counted
            asyncio.run(batch(s, [EVENTS[-1]], args.max_tokens, SCHEMA, 1))
            s.constrained.clear()
        print(f"started and warmed in {time.monotonic() - t0:.0f} s", flush=True)
        med, ptoks, last = measure_all(servers, args)
        rss = {s.name: peak_rss_mib(s.proc.pid) for s in servers}
        notes = cross_checks(servers, last)
    finally:
        for s in servers:
            stop(s)
    names = [s.name for s in servers]
    valid = [validity(s.constrained) for s in servers]
    print(f"\nmedians of {args.rounds} round(s), {time.monotonic() - t0:.0f} s in all:")
    print("\n".join(table(rows(names, med, rss, ptoks, args.concurrency), valid)))
    print("\n".join(notes))
    for name, (_, _, _, bad) in zip(names, valid, strict=True):
        for b in bad:
            print(f"{name}, invalid: {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
