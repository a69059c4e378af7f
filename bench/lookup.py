"""Prompt-lookup speculation: Corral with vs without, and llama.cpp with vs without its own.

    .venv/bin/python -m bench.lookup [--quick] [--threads N] [--docs N] [--no-llama]

The extraction set: `--docs` (default 40) documents generated here from seeded templates
(invoices, papers' front matter, bug reports, product pages; 400-1,500 tokens each), each with a
JSON Schema whose instance mostly copies spans of the document. Greedy, streamed, `max_tokens`
large enough to finish. Every output is validated with `jsonschema`.

Servers, on the same cores with the same threads and the same GGUF (the embedded default model
unless `--gguf`): one `corral serve` (speculation on; the "without" runs send the request
extension `"speculative": false`, so both sides share one process), then llama-cpp-python's
server without and with `--draft_model prompt-lookup-decoding` (its `LlamaPromptLookupDecoding`;
`--draft_model_num_pred_tokens` 10, its default), one at a time. llama.cpp constrains with its
own converter of the schema (`{"type": "json_object", "schema": ...}`).

Figures (each the ratio printed beside it):
1. decode tokens/s at 1 request (median over documents of (tokens - 1) / (last - first chunk)),
   Corral with / without, llama.cpp with / without, Corral with / llama.cpp with;
2. decode tokens/s at 8 concurrent (all output tokens / wall time of the batch; Corral's prefix
   cache is flushed before each run so both sides prefill the same);
3. acceptance: Corral's lookup draft tokens accepted / proposed (`usage.speculative`);
4. a free-chat set (short prompts, nothing to copy): Corral with / without at 1 request, where
   the adaptive k must turn speculation off (target >= 0.95).
Targets: (1) Corral with / without >= 1.8, Corral with / llama.cpp with >= 1.5; (2) >= 0.95.

The machine's load average is printed at the start and the end: on a shared machine the figures
move with it; compare ratios measured in the same run only. `--passes` prints figures a loaded
machine does not move instead, in-process on the engine `corral serve` builds: forward passes
per output token, acceptance and CPU seconds with and without speculation, outputs compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
import jsonschema

from bench.peer_servers import Reply, Server, start, stop, stream
from bench.provenance import header

FIRST = ["Margaret", "Tobias", "Ingrid", "Rafael", "Chen", "Amara", "Dmitri", "Lucia", "Kofi",
         "Helena", "Yusuf", "Sofia", "Anders", "Priya", "Mateo", "Noor"]  # fmt: skip
LAST = ["Okonkwo", "Lindqvist", "Castellanos", "Haverford", "Nakamura", "Brennan", "Adeyemi",
        "Vasquez", "Thornbury", "Kowalczyk", "Devereux", "Mbeki", "Saarinen", "Ferreira"]  # fmt: skip
ORGS = ["Bluewater Office Supplies", "Northgate Analytics", "Fernwood Labs", "Kestrel Robotics",
        "Harbourline Logistics", "Quillfeather Press", "Ironbark Systems", "Meridian Textiles",
        "Solstice Biotech", "Cobalt Ridge Energy"]  # fmt: skip
CITIES = ["Portsmouth", "Berlin", "Rotterdam", "Lyon", "Gothenburg", "Porto", "Krakow", "Leeds",
          "Tampere", "Bologna"]  # fmt: skip
STREETS = ["Harbour Road", "Kastanienallee", "Mill Lane", "Rue des Tanneurs", "Station Street",
           "Avenida da Liberdade", "Ulica Dluga", "Canal Walk"]  # fmt: skip
NOUNS = [
    "system",
    "method",
    "network",
    "signal",
    "ledger",
    "protocol",
    "sensor",
    "archive",
    "pipeline",
    "model",
    "schedule",
    "interface",
    "budget",
    "report",
    "engine",
    "cluster",
]
ADJS = ["robust", "quarterly", "adaptive", "distributed", "annual", "modular", "secure",
        "efficient", "legacy", "optimal", "regional", "compact", "scalable", "manual"]  # fmt: skip
VERBS = ["improves", "reduces", "tracks", "replaces", "measures", "extends", "delays",
         "supports", "describes", "combines", "limits", "exposes"]  # fmt: skip
PRODUCTS = ["mesh office chair", "standing desk frame", "wireless keyboard", "USB-C docking station",
            "noise-cancelling headset", "27-inch monitor", "laser printer toner",
            "ergonomic footrest", "whiteboard marker pack", "laptop stand"]  # fmt: skip

STR = {"type": "string"}
INT = {"type": "integer"}
NUM = {"type": "number"}


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}  # fmt: skip


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _address(rng: random.Random) -> str:
    return f"{rng.randint(1, 240)} {rng.choice(STREETS)}, {rng.choice(CITIES)}"


def _filler(rng: random.Random, words: int) -> str:
    """Seeded prose of about `words` words (what a real document holds around its fields)."""
    out, n = [], 0
    while n < words:
        s = (f"The {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
             f"{rng.choice(ADJS)} {rng.choice(NOUNS)} of {rng.choice(ORGS)} in "
             f"{rng.choice(CITIES)}.")  # fmt: skip
        out.append(s)
        n += len(s.split())
    return " ".join(out)


def invoice(rng: random.Random, words: int) -> tuple[str, dict, str]:
    items = [(rng.choice(PRODUCTS), rng.randint(1, 12), rng.randint(5, 900)) for _ in range(
        rng.randint(3, 6))]  # fmt: skip
    number = f"INV-{rng.randint(2019, 2025)}-{rng.randint(100, 9999):04d}"
    vendor, customer = rng.sample(ORGS, 2)
    lines = [f"INVOICE {number}", f"Vendor: {vendor} Ltd., {_address(rng)}",
             f"Bill to: {customer} GmbH, {_address(rng)}",
             f"Date: 2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
             f"Contact: {_person(rng)}", "Items:"]  # fmt: skip
    for i, (name, qty, price) in enumerate(items, 1):
        lines.append(f" {i}. {name} - quantity {qty} - unit price {price}.00 EUR")
    lines.append(f"Total due: {sum(q * p for _, q, p in items)}.00 EUR")
    lines.append("Notes: " + _filler(rng, words))
    schema = _obj({
        "invoice_number": STR, "vendor": STR, "customer": STR, "contact": STR,
        "items": {"type": "array", "items": _obj({"description": STR, "quantity": INT})},
    })  # fmt: skip
    return "\n".join(lines), schema, "the invoice's number, vendor, customer, contact and items"


def paper(rng: random.Random, words: int) -> tuple[str, dict, str]:
    title = (
        f"A {rng.choice(ADJS).capitalize()} {rng.choice(NOUNS).capitalize()} for "
        f"{rng.choice(ADJS).capitalize()} {rng.choice(NOUNS).capitalize()} Estimation"
    )
    authors = [_person(rng) for _ in range(rng.randint(2, 5))]
    affil = rng.choice(ORGS)
    lines = [
        title,
        ", ".join(authors),
        f"{affil}, {rng.choice(CITIES)}",
        f"Keywords: {', '.join(rng.sample(NOUNS, 4))}",
        "Abstract",
        _filler(rng, words),
    ]
    schema = _obj({
        "title": STR, "authors": {"type": "array", "items": STR}, "affiliation": STR,
        "keywords": {"type": "array", "items": STR},
    })  # fmt: skip
    return "\n".join(lines), schema, "the paper's title, authors, affiliation and keywords"


def bug(rng: random.Random, words: int) -> tuple[str, dict, str]:
    comp = f"{rng.choice(NOUNS)}/{rng.choice(NOUNS)}-{rng.choice(['renderer', 'parser', 'cache'])}"
    version = f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}"
    title = f"Crash when the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} " \
            f"the {rng.choice(NOUNS)}"  # fmt: skip
    reporter = _person(rng)
    lines = [f"Bug #{rng.randint(1000, 99999)}: {title}", f"Reporter: {reporter}",
             f"Component: {comp}", f"Version: {version}",
             f"Steps: open the {rng.choice(NOUNS)} view, choose Export, press Save.",
             "Discussion: " + _filler(rng, words)]  # fmt: skip
    schema = _obj({"title": STR, "reporter": STR, "component": STR, "version": STR,
                   "steps": STR})  # fmt: skip
    return "\n".join(lines), schema, "the bug's title, reporter, component, version and steps"


def product(rng: random.Random, words: int) -> tuple[str, dict, str]:
    name = f"{rng.choice(ORGS).split()[0]} {rng.choice(PRODUCTS).title()}"
    feats = [f"{rng.choice(ADJS)} {rng.choice(NOUNS)}" for _ in range(rng.randint(3, 5))]
    lines = [
        name,
        f"Sold by {rng.choice(ORGS)}",
        f"Price: {rng.randint(10, 999)} EUR",
        "Features:",
        *[f"- {f}" for f in feats],
        "Description: " + _filler(rng, words),
    ]
    schema = _obj({"name": STR, "seller": STR, "price_eur": INT,
                   "features": {"type": "array", "items": STR}})  # fmt: skip
    return "\n".join(lines), schema, "the product's name, seller, price and features"


TEMPLATES = (invoice, paper, bug, product)


def documents(count: int, seed: int = 0) -> list[tuple[str, dict]]:
    """`count` (prompt, schema) pairs: the templates in turn, 300-1,100 words of prose each
    (about 400-1,500 tokens with the fields)."""
    out = []
    for i in range(count):
        rng = random.Random(seed * 1_000_003 + i)
        doc, schema, what = TEMPLATES[i % len(TEMPLATES)](rng, rng.randint(300, 1100))
        out.append((f"{doc}\n\nExtract {what} from the document above as JSON.", schema))
    return out


CHAT = ["Write a short poem about the sea.", "What are three tips for learning to cook?",
        "Explain photosynthesis to a child.", "Give me a name for a bakery and say why.",
        "How do I stay focused while studying?", "Describe a walk in an autumn forest.",
        "What is a good hobby for a rainy day?", "Tell me a fun fact about octopuses."]  # fmt: skip


def body(server: Server, prompt: str, schema: dict | None, max_tokens: int, spec: bool) -> dict:
    req = {"model": server.model, "messages": [{"role": "user", "content": prompt}],
           "max_tokens": max_tokens, "temperature": 0, "stream": True}  # fmt: skip
    if server.name.startswith("Corral"):
        req["stream_options"] = {"include_usage": True}
        req["speculative"] = spec
        if schema:
            req["response_format"] = {"type": "json_schema",
                                      "json_schema": {"name": "x", "strict": True,
                                                      "schema": schema}}  # fmt: skip
    else:
        req["repeat_penalty"] = 1.0
        if schema:
            req["response_format"] = {"type": "json_object", "schema": schema}
    return req


async def run(server: Server, reqs: list[dict], concurrency: int) -> tuple[list[Reply], float]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=server.url, timeout=3600, limits=limits) as client:

        async def one(req: dict) -> Reply:
            async with sem:
                return await stream(client, req)

        t0 = time.perf_counter()
        replies = await asyncio.gather(*(one(r) for r in reqs))
        return list(replies), time.perf_counter() - t0


def flush(server: Server) -> None:
    if server.name.startswith("Corral"):
        httpx.post(server.url + "/flush_cache", timeout=60)


def measure(server: Server, docs: list[tuple[str, dict]], spec: bool, concurrency: int,
            max_tokens: int) -> dict:  # fmt: skip
    flush(server)
    reqs = [body(server, p, s, max_tokens, spec) for p, s in docs]
    replies, wall = asyncio.run(run(server, reqs, concurrency))
    rates = [r.decode_rate() for r in replies]
    valid = 0
    for r, (_, schema) in zip(replies, docs, strict=True):
        try:
            jsonschema.validate(json.loads(r.content), schema) if schema else None
            valid += r.finish == "stop"
        except (ValueError, jsonschema.ValidationError):
            pass
    spec_p = sum((r.speculative or {}).get("proposed_tokens", 0) for r in replies)
    spec_a = sum((r.speculative or {}).get("accepted_tokens", 0) for r in replies)
    return {
        "rate1": statistics.median(x for x in rates if x is not None),
        "agg": sum(r.tokens for r in replies) / wall,
        "valid": valid,
        "n": len(replies),
        "tokens": sum(r.tokens for r in replies),
        "proposed": spec_p,
        "accepted": spec_a,
        "outputs": [r.content for r in replies],
    }


def passes(docs: list[tuple[str, dict]], max_tokens: int) -> None:
    """`--passes`: the extraction set on the server's engine in this process, greedy, one
    request at a time, with and without speculation."""
    from dataclasses import replace

    from corral.api.config import ServerConfig
    from corral.engine import Engine, SamplingParams, load_model
    from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

    cfg = ServerConfig()
    model = load_model(cfg.model, cfg.torch_dtype, cfg.torch_device, cache_dir=cfg.cache_dir,
                       quantize=cfg.quantization)  # fmt: skip
    tok = model.tokenizer
    info = TokenizerInfo.from_hf(tok, vocab_size=model.vocab_size,
                                 eos_token_ids=model.eos_token_ids)  # fmt: skip
    firsts = None
    for spec in (True, False):
        eng = Engine(model, replace(cfg.engine_config(), speculative=spec))
        outs, cpu = [], time.process_time()
        for prompt, schema in docs:
            enc = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                          add_generation_prompt=True)  # fmt: skip
            ids = list(enc["input_ids"] if not isinstance(enc, list) else enc)
            c = compile_constraint(ConstraintSpec.json_schema(schema), info)
            params = SamplingParams(max_tokens=max_tokens, temperature=0)
            outs.append(eng.generate([ids], params, [c])[0][0].token_ids)
        s = eng.stats()
        print(f"speculation {'on ' if spec else 'off'}: {s['output_tokens']} output tokens, "
              f"{s['steps']} steps, {s['forward_passes_per_output_token']:.3f} passes per output "
              f"token, lookup drafts accepted {s['lookup_draft_accepted']} / "
              f"{s['lookup_draft_tokens']}, {time.process_time() - cpu:.1f} CPU s (prefill "
              f"included)", flush=True)  # fmt: skip
        eng.close()
        if firsts is None:
            firsts = outs
        else:
            print(f"outputs identical with and without: {firsts == outs}")


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="default: the embedded SmolLM2-135M-Instruct GGUF")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--chat-tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="4 documents, 2 chat prompts")
    ap.add_argument("--no-llama", action="store_true", help="Corral's figures alone")
    ap.add_argument("--passes", action="store_true", help="passes per token, in-process only")
    ap.add_argument("--start-timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    if args.gguf is None:
        from corral.engine.loading.assets import default_gguf_path

        args.gguf = str(default_gguf_path())
    docs = documents(4 if args.quick else args.docs)
    chat = [(p, None) for p in (CHAT[:2] if args.quick else CHAT)]
    cores = set(sorted(os.sched_getaffinity(0))[: args.threads])
    print(header(__file__), flush=True)
    if args.passes:
        print(f"{load()}; {len(docs)} documents, max_tokens {args.max_tokens}", flush=True)
        passes(docs, args.max_tokens)
        print(f"{load()} at the end")
        return 0
    print(
        f"{load()} at the start; model {args.gguf}; cores {sorted(cores)}, {args.threads} "
        f"threads; {len(docs)} documents, max_tokens {args.max_tokens}; greedy",
        flush=True,
    )
    try:
        from transformers import AutoTokenizer

        from corral.engine.loading.assets import resolve_model_folder

        tok = AutoTokenizer.from_pretrained(str(resolve_model_folder(None)))
        sizes = [len(tok.encode(p)) for p, _ in docs]
        print(f"document prompts: {min(sizes)}-{max(sizes)} tokens", flush=True)
    except Exception as e:  # the sizes are a note, not a figure
        print(f"(prompt sizes not counted: {e})")
    corral_bin = str(Path(sys.executable).with_name("corral"))
    port = 18731
    results: dict[tuple[str, str], dict] = {}
    t0 = time.monotonic()
    cmd = [corral_bin, "serve", "--model", args.gguf, "--port", str(port), "--threads",
           str(args.threads), "--max-concurrent", str(max(8, args.concurrency))]  # fmt: skip
    print("Corral: " + " ".join(cmd), flush=True)
    srv = start("Corral", cmd, f"http://127.0.0.1:{port}", cores, args.start_timeout)
    if srv is None:
        return 1
    try:
        measure(srv, docs[:1], True, 1, 16)  # warm-up
        for spec in (True, False):
            side = "with" if spec else "without"
            results[("Corral", side, "1")] = measure(srv, docs, spec, 1, args.max_tokens)
            results[("Corral", side, "c")] = measure(srv, docs, spec, args.concurrency,
                                                      args.max_tokens)  # fmt: skip
            results[("Corral", side, "chat")] = measure(srv, chat, spec, 1, args.chat_tokens)
            print(f"  Corral {side} speculation done ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        stop(srv)
    report(results, args)  # Corral's figures now, in case the peers' runs are cut short
    llama_ok = False
    if not args.no_llama:
        try:
            import llama_cpp  # noqa: F401

            llama_ok = True
        except ImportError:
            print("llama-cpp-python is absent (pip install -e '.[peers]'): Corral's figures alone")
    for spec in (False, True) if llama_ok else ():
        side = "with" if spec else "without"
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", args.gguf, "--n_threads",
               str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "4096",
               "--interrupt_requests", "False", "--host", "127.0.0.1", "--port",
               str(port + 1)]  # fmt: skip
        if spec:
            cmd += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens",
                    "10"]  # fmt: skip
        print("llama.cpp: " + " ".join(cmd), flush=True)
        srv = start("llama.cpp", cmd, f"http://127.0.0.1:{port + 1}", cores, args.start_timeout)
        if srv is None:
            continue
        try:
            measure(srv, docs[:1], spec, 1, 16)
            results[("llama.cpp", side, "1")] = measure(srv, docs, spec, 1, args.max_tokens)
            results[("llama.cpp", side, "c")] = measure(srv, docs, spec, args.concurrency,
                                                         args.max_tokens)  # fmt: skip
            print(f"  llama.cpp {side} done ({time.monotonic() - t0:.0f} s)", flush=True)
        finally:
            stop(srv)
    report(results, args)
    print(f"{load()} at the end; {time.monotonic() - t0:.0f} s in all")
    return 0


def report(results: dict, args: argparse.Namespace) -> None:
    def get(name: str, side: str, kind: str, key: str) -> float | None:
        r = results.get((name, side, kind))
        return r[key] if r else None

    cw, cwo = get("Corral", "with", "1", "rate1"), get("Corral", "without", "1", "rate1")
    lw, lwo = get("llama.cpp", "with", "1", "rate1"), get("llama.cpp", "without", "1", "rate1")
    print("\n| figure | with | without | with / without | target |\n|---|---|---|---|---|")
    print(f"| 1. Corral decode tok/s, 1 request | {cw:.1f} | {cwo:.1f} | {ratio(cw, cwo)} | "
          f">= 1.8x |")  # fmt: skip
    cc, cco = get("Corral", "with", "c", "agg"), get("Corral", "without", "c", "agg")
    print(f"| 2. Corral tok/s, {args.concurrency} concurrent | {cc:.1f} | {cco:.1f} | "
          f"{ratio(cc, cco)} | >= 0.95x |")  # fmt: skip
    if cw is None or cwo is None:
        print("| (Corral's runs did not finish) | | | | |")
        return
    fw, fwo = get("Corral", "with", "chat", "rate1"), get("Corral", "without", "chat", "rate1")
    print(f"| 4. Corral free chat decode tok/s, 1 request | {fw:.1f} | {fwo:.1f} | "
          f"{ratio(fw, fwo)} | >= 0.95x |")  # fmt: skip
    if lw or lwo:
        print(f"| 1. llama.cpp decode tok/s, 1 request | {lw or 0:.1f} | {lwo or 0:.1f} | "
              f"{ratio(lw, lwo)} | |")  # fmt: skip
        lc, lco = get("llama.cpp", "with", "c", "agg"), get("llama.cpp", "without", "c", "agg")
        print(f"| 2. llama.cpp tok/s, {args.concurrency} concurrent | {lc or 0:.1f} | "
              f"{lco or 0:.1f} | {ratio(lc, lco)} | |")  # fmt: skip
        print(f"| 1. Corral with / llama.cpp with, 1 request | {cw:.1f} | {lw or 0:.1f} | "
              f"{ratio(cw, lw)} | >= 1.5x |")  # fmt: skip
    for kind, label in (("1", "1 request"), ("c", f"{args.concurrency} concurrent")):
        r = results.get(("Corral", "with", kind))
        if r and r["proposed"]:
            print(f"| 3. Corral acceptance, {label} | {r['accepted']} / {r['proposed']} | | "
                  f"{r['accepted'] / r['proposed']:.2f} | |")  # fmt: skip
    print("\nvalid outputs (jsonschema, finished with stop):")
    for (name, side, kind), r in sorted(results.items()):
        what = {"1": "extraction, 1 request", "c": "extraction, concurrent", "chat": "free chat"}
        print(f"  {name} {side}, {what[kind]}: {r['valid']}/{r['n']} valid, {r['tokens']} tokens")
    same = [
        results[("Corral", "with", k)]["outputs"] == results[("Corral", "without", k)]["outputs"]
        for k in ("1", "c", "chat")
        if ("Corral", "with", k) in results and ("Corral", "without", k) in results
    ]
    print(f"Corral outputs identical with and without speculation: {all(same)} ({same})")


if __name__ == "__main__":
    sys.exit(main())
