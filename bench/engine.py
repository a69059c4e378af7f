"""Engine benchmark: Corral against Hugging Face `generate()`, same model, prompts and dtype.

    python -m bench.engine [--quick] [--threads N]

    python -m bench.engine --only jump-forward      # one figure (repeatable)

Every engine runs with the EngineConfig `corral serve` builds by default
(`ServerConfig().engine_config()`) and this run's `--threads`; a figure that changes a field
(an ablation, or the bench's former batch-32 setting) says so on its line.

Prints, for each figure, ours, the peer's (or the reference run's) and the ratio:
1. throughput (output tokens/s, greedy, fixed output length) at batch 1, 8 and 32 vs HF; batch
   32 also with 32 seats and a 2,048-token step budget (the server's default seats 16);
2. constrained TPOT vs unconstrained TPOT at batch 8 (Glaiveai2K schemas; the unconstrained run
   gives each prompt as many tokens as its constrained run produced, so both runs have the
   same batch shape step by step). Runs are interleaved in pairs; the ratio is the median of
   the per-pair ratios (printed), beside the median TPOT of each side;
3. TTFT with a 1,000-token shared prefix: prefix-cache hit vs miss;
4. forward passes per output token with jump-forward vs without, on 50 Glaiveai2K schemas
   spread evenly over the subset. Each request is a realistic chat request for JSON: a
   system prompt asking for one JSON object matching the schema (given in full), and a user
   message asking for the function's arguments; the same requests, greedy, in both runs, and
   the outputs must be identical. A pass is counted once per sequence per model forward it
   takes part in (prefill chunks included), over all output tokens;
5. TPOT with overlap scheduling (`EngineConfig.overlap`) vs without at batch 8 and 32, the
   outputs compared token for token.

Constrained figures compile each schema as the server does by default, with closed objects
(docs/serving.md, "Closed objects"); `--open-objects` compiles them as given. Outputs that end with
`stop` are checked against the schema as given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch
from jsonschema import Draft202012Validator

from bench.provenance import header
from corral.api.config import ServerConfig
from corral.engine import Engine, EngineConfig, SamplingParams, load_model
from corral.engine.loading.assets import resolve_model_folder
from corral.engine.serving.config import available_cores
from corral.grammar import ConstraintError, ConstraintSpec, TokenizerInfo, compile_constraint
from corral.grammar.schema.closed_objects import close_objects

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench"
THREADS: dict[str, int] = {}  # EngineConfig(num_threads=...) for every engine of the run
CLOSED_OBJECTS = True  # --open-objects turns it off, like the server's flag
TPOT_REPEATS = 3
QUESTIONS = [
    "Explain how a bicycle works.",
    "Write a short poem about autumn leaves.",
    "What are the main causes of inflation?",
    "Describe the water cycle for a child.",
    "Give three tips for learning a new language.",
    "Why do cats purr?",
    "Summarize the plot of Romeo and Juliet.",
    "How do vaccines train the immune system?",
]


def chat(tok, text: str) -> list[int]:
    enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(enc["input_ids"] if not isinstance(enc, list) else enc)


def engine_config(**overrides) -> EngineConfig:
    """`corral serve`'s default EngineConfig with this run's threads and `overrides` (a figure
    that passes any names them in its output)."""
    return replace(ServerConfig().engine_config(), **THREADS, **overrides)


def row(
    name: str, ours: float, peer: float, unit: str, peer_name: str, ratio: float | None = None
) -> None:
    """One figure; `ratio` defaults to ours / peer."""
    if ratio is None:
        ratio = ours / peer if peer else float("nan")
    print(f"{name:<44} ours {ours:10.3f} {unit:<8} {peer_name} {peer:10.3f}  ratio {ratio:6.2f}")


# ---- 1. throughput ----------------------------------------------------------------------------


def corral_throughput(model, prompts, new_tokens: int, config: EngineConfig) -> float:
    warm = Engine(model, config)
    warm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0))
    warm.close()
    eng = Engine(model, config)  # a cold prefix cache
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    t = time.perf_counter()
    out = eng.generate(prompts, params)
    dt = time.perf_counter() - t
    eng.close()
    return sum(len(c[0].token_ids) for c in out) / dt


def hf_throughput(hf, tok, prompts, new_tokens: int) -> float:
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = dict(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=tok.pad_token_id,
    )
    with torch.inference_mode():
        hf.generate(
            input_ids=ids[:1],
            attention_mask=mask[:1],
            **{**kw, "max_new_tokens": 2, "min_new_tokens": 2},
        )
        t = time.perf_counter()
        out = hf.generate(input_ids=ids, attention_mask=mask, **kw)
        dt = time.perf_counter() - t
    return (out.shape[1] - width) * len(prompts) / dt


# ---- 2. constrained TPOT ----------------------------------------------------------------------


def glaive_schemas(tokinfo, count: int) -> list[tuple[str, dict, object]]:
    """(function name, schema, compiled) of `count` Glaiveai2K schemas spread evenly over the
    subset (every k-th file by name, so no one function family dominates), skipping the ones
    that do not compile (refused: fail closed) for the next ones."""
    files = sorted(CORPUS.glob("Glaiveai2K---*.json"))
    step = max(1, len(files) // count)
    out = []
    for path in (f for start in range(step) for f in files[start::step]):
        schema = json.loads(path.read_text())["schema"]
        # what the server compiles by default: objects get only their declared properties
        # (docs/serving.md, "Closed objects"); outputs are still judged by the schema as given
        constrained = close_objects(schema) if CLOSED_OBJECTS else schema
        try:
            compiled = compile_constraint(ConstraintSpec.json_schema(constrained), tokinfo)
        except ConstraintError:
            continue
        out.append((path.stem.split("---", 1)[1].rsplit("_", 1)[0], schema, compiled))
        if len(out) == count:
            break
    return out


def json_request(tok, name: str, schema: dict) -> list[int]:
    """A chat request for JSON, as an application would send it."""
    system = (
        "You are a helpful assistant that answers with JSON only. Reply with a single JSON "
        "object that conforms to this JSON Schema, and nothing else:\n" + json.dumps(schema)
    )
    user = f"I need the arguments for a call to `{name}`. Fill them in with realistic values."
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True)
    return list(enc["input_ids"] if not isinstance(enc, list) else enc)


def tpot(
    model, prompts, params, constraints, jump_forward: bool = True, ids=None, **config
) -> tuple[float, list[int]]:
    """(mean time per output token after the first, over the batch's sequences; the number of
    tokens each sequence produced). ``params``: one SamplingParams per prompt. ``ids``: a list
    to append each sequence's output token ids to. ``config``: EngineConfig overrides."""
    eng = Engine(model, engine_config(jump_forward=jump_forward, **config))
    rids = [
        eng.add_request(p, sp, c) for p, sp, c in zip(prompts, params, constraints, strict=True)
    ]
    first, last, count, outputs = {}, {}, dict.fromkeys(rids, 0), {}
    while eng.has_unfinished():
        outs = eng.step()
        now = time.perf_counter()
        for o in outs:
            if ids is not None:
                outputs.setdefault(o.request_id, []).extend(o.token_ids)
            if o.token_ids:
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
                count[o.request_id] += len(o.token_ids)
    eng.close()
    if ids is not None:
        ids += [outputs.get(r, []) for r in rids]
    per = [(last[r] - first[r]) / (count[r] - 1) for r in rids if count[r] > 1]
    return sum(per) / len(per), [count[r] for r in rids]


# ---- 3. TTFT hit vs miss ----------------------------------------------------------------------


def ttft(eng: Engine, prompt: list[int]) -> float:
    t = time.perf_counter()
    eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0))
    while eng.has_unfinished():
        if any(o.token_ids for o in eng.step()):
            break
    dt = time.perf_counter() - t
    eng.run_until_done()
    return dt


def shared_prefix(tok, n: int) -> list[int]:
    words = " ".join(f"Record {i}: the {QUESTIONS[i % 8].lower()}" for i in range(400))
    return tok.encode(words, add_special_tokens=False)[:n]


# ---- 4. forward passes per output token -------------------------------------------------------


def passes_per_token(model, prompts, constraints, max_tokens: int, **config):
    """(stats, token ids per request) of one greedy run over all requests at once."""
    eng = Engine(model, engine_config(**config))
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    out = eng.generate(prompts, params, constraints)
    eng.close()
    return eng.stats(), [c[0] for c in out]


def jump_forward_figures(model, tok, schemas, max_tokens: int) -> None:
    prompts = [json_request(tok, name, schema) for name, schema, _ in schemas]
    constraints = [c for _, _, c in schemas]
    off, outs_off = passes_per_token(model, prompts, constraints, max_tokens, jump_forward=False)
    stopped = [
        (o, s) for o, (_, s, _) in zip(outs_off, schemas, strict=True) if o.finish_reason == "stop"
    ]
    valid = sum(_valid(o.text, s) for o, s in stopped)
    print(
        f"  {'closed' if CLOSED_OBJECTS else 'open'} objects: {len(stopped)}/{len(schemas)} "
        f"outputs end with stop, {valid} of them valid against the schema as given"
    )
    print("  no JF: jump_forward=False; JF grammar-forced drafts: lookup_draft_tokens=0")
    runs = (("grammar-forced drafts", 0), ("+ lookup drafts", EngineConfig.lookup_draft_tokens))
    for label, lookup in runs:
        on, outs_on = passes_per_token(
            model, prompts, constraints, max_tokens, jump_forward=True, lookup_draft_tokens=lookup
        )
        same = sum(a.token_ids == b.token_ids for a, b in zip(outs_on, outs_off, strict=True))
        row(
            f"passes / output token, JF {label}",
            on["forward_passes_per_output_token"],
            off["forward_passes_per_output_token"],
            "",
            "no JF",
        )
        print(
            f"  {len(schemas)} schemas, max_tokens {max_tokens}: {on['output_tokens']} output "
            f"tokens, {on['seq_forward_passes']} vs {off['seq_forward_passes']} passes; draft "
            f"acceptance {on['draft_acceptance_rate']:.3f} ({on['draft_accepted']}/"
            f"{on['draft_tokens']}; lookup {on['lookup_draft_accepted']}/"
            f"{on['lookup_draft_tokens']}), {on['forced_tokens']} forced tokens; identical "
            f"outputs {same}/{len(schemas)}"
        )


def _valid(text: str, schema: dict) -> bool:
    try:
        instance = json.loads(text)
    except json.JSONDecodeError:
        return False
    return Draft202012Validator(schema).is_valid(instance)


PARTS = ("throughput", "tpot", "ttft", "jump-forward", "overlap")


def throughput_figures(model, tok, new_tokens: int) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(resolve_model_folder(None)), dtype=torch.float32)
    hf.eval()
    prompts = [chat(tok, QUESTIONS[i % len(QUESTIONS)] + f" (#{i})") for i in range(32)]
    hf_rate = {}
    for b in (1, 8, 32):
        ours = corral_throughput(model, prompts[:b], new_tokens, engine_config())
        hf_rate[b] = hf_throughput(hf, tok, prompts[:b], new_tokens)
        row(f"throughput batch {b} (tok/s)", ours, hf_rate[b], "tok/s", "HF")
    # The server's default seats 16 sequences, so its batch 32 decodes 16 at a time; the
    # bench's own setting seats all 32 and prefills them in one step.
    wide = engine_config(max_num_seqs=64, max_batched_tokens=2048)
    ours = corral_throughput(model, prompts, new_tokens, wide)
    row("throughput batch 32, bench config (tok/s)", ours, hf_rate[32], "tok/s", "HF")
    print("  bench config: max_num_seqs=64, max_batched_tokens=2048; other lines: server's")


def tpot_figures(model, tok, tokinfo, new_tokens: int) -> None:
    """Constrained vs unconstrained TPOT on the same batch shape: a constrained sequence stops
    when its JSON is complete, so the unconstrained run gives each prompt exactly as many tokens
    (ignore_eos) as its constrained run produced; what differs is only the constraint's work."""
    eight = glaive_schemas(tokinfo, 8)
    prompts = [json_request(tok, name, schema) for name, schema, _ in eight]
    constraints = [c for *_, c in eight]
    params = [SamplingParams(max_tokens=new_tokens * 2, temperature=0)] * 8
    _, lengths = tpot(model, prompts, params, constraints, jump_forward=False)  # also a warm-up
    free_params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    runs: dict[str, list[float]] = {"free": [], "cons": [], "cons_jf": []}
    for _ in range(TPOT_REPEATS):  # interleaved, so that drift on a shared box hits all three
        runs["free"].append(tpot(model, prompts, free_params, [None] * 8)[0])
        runs["cons"].append(tpot(model, prompts, params, constraints, jump_forward=False)[0])
        runs["cons_jf"].append(tpot(model, prompts, params, constraints, jump_forward=True)[0])
    print(
        f"  output lengths (tokens): {lengths}; {TPOT_REPEATS} interleaved runs; TPOTs: median; "
        "ratio: median of the per-run ratios; no JF: jump_forward=False"
    )
    free = statistics.median(runs["free"])
    for key, label in (("cons", "constrained, no JF"), ("cons_jf", "constrained + JF")):
        ratios = [c / f for c, f in zip(runs[key], runs["free"], strict=True)]
        print(f"  {label} / unconstrained, per run: {[round(r, 3) for r in ratios]}")
        ours = statistics.median(runs[key])
        ratio = statistics.median(ratios)
        row(f"TPOT batch 8, {label} (ms)", ours * 1e3, free * 1e3, "ms", "unconstr.", ratio)


def overlap_figures(model, tok, new_tokens: int) -> None:
    """TPOT with overlap scheduling vs without, at batch 8 and 32 (32 seats), greedy with
    ignore_eos; runs interleaved in pairs, each on a thread of its own (as the server's engine
    thread), and the outputs must be identical."""
    params = SamplingParams(max_tokens=new_tokens * 2, temperature=0, ignore_eos=True)
    with ThreadPoolExecutor(max_workers=1) as stepper:
        for b in (8, 32):
            prompts = [chat(tok, QUESTIONS[i % len(QUESTIONS)] + f" (#{i})") for i in range(b)]
            runs: dict[bool, list[float]] = {False: [], True: []}
            got: dict[bool, list] = {False: [], True: []}
            for _ in range(TPOT_REPEATS):
                for overlap in (False, True):
                    ids: list = []
                    run = stepper.submit(
                        tpot, model, prompts, [params] * b, [None] * b, True, ids,
                        overlap=overlap, max_num_seqs=32,
                    )  # fmt: skip
                    runs[overlap].append(run.result()[0])
                    got[overlap] = ids
            same = "identical" if got[False] == got[True] else "DIFFERENT"
            ratios = [on / off for on, off in zip(runs[True], runs[False], strict=True)]
            on, off = statistics.median(runs[True]), statistics.median(runs[False])
            label = f"TPOT batch {b}, overlap on (ms)"
            row(label, on * 1e3, off * 1e3, "ms", "off", statistics.median(ratios))
            print(f"  per-run on/off: {[round(r, 3) for r in ratios]}; outputs {same}")
    print("  overlap runs: max_num_seqs=32; other fields: server's")


def ttft_figures(model, tok) -> None:
    prefix = shared_prefix(tok, 1000)
    eng = Engine(model, engine_config())
    ttft(eng, chat(tok, "warm up"))
    miss = ttft(eng, prefix + chat(tok, QUESTIONS[0]))
    hit = ttft(eng, prefix + chat(tok, QUESTIONS[1]))
    eng.close()
    row("TTFT, 1000-token shared prefix (s)", hit, miss, "s", "miss")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer tokens per request")
    ap.add_argument(
        "--threads", type=int, default=available_cores(), help="torch threads (both runs)"
    )
    ap.add_argument(
        "--only", choices=PARTS, action="append", help="run only these figures (repeatable)"
    )
    ap.add_argument(
        "--open-objects",
        action="store_true",
        help="compile the schemas as given (the server's --open-objects true)",
    )
    args = ap.parse_args()
    print(header(__file__), flush=True)
    global CLOSED_OBJECTS
    CLOSED_OBJECTS = not args.open_objects
    parts = set(args.only or PARTS)
    torch.set_num_threads(args.threads)
    THREADS["num_threads"] = args.threads
    new_tokens = 16 if args.quick else 32
    model = load_model()
    tok = model.tokenizer
    print(
        f"model {model.name}, float32, CPU, {args.threads} torch threads, {new_tokens} new tokens"
    )
    print(f"engine: corral serve's default, {engine_config()}")
    if "throughput" in parts:
        throughput_figures(model, tok, new_tokens)
    tokinfo = TokenizerInfo.from_hf(
        tok, vocab_size=model.vocab_size, eos_token_ids=model.eos_token_ids
    )
    if not CORPUS.exists():
        print(f"{CORPUS} is absent: skipping the constrained figures")
    elif "tpot" in parts:
        tpot_figures(model, tok, tokinfo, new_tokens)
    if "ttft" in parts:
        ttft_figures(model, tok)
    if CORPUS.exists() and "jump-forward" in parts:
        jump_forward_figures(model, tok, glaive_schemas(tokinfo, 50), 64 if args.quick else 128)
    if "overlap" in parts:
        overlap_figures(model, tok, new_tokens)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
