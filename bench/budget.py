#!/usr/bin/env python
"""Budget closing: how many outputs cut by `max_tokens` are still valid JSON instances.

For MaskBench schemas (a stratified sample, read as `bench/maskbench.py` reads them) that Corral
compiles and whose shortest valid instance `grammar.shortest` finds, the default model answers
greedily with `max_tokens` = that instance's token length + 0, 8 and 32, once with budget
closing and once without (what every peer does: the text is cut where the budget ends). The
figure is the share of outputs that parse and validate (jsonschema, Draft 2020-12) against the
original schema; the target with budget closing is 100%.

`--spare N` also runs once with `max_tokens` = shortest + N (default 120) and counts the outputs
budget closing ended with more than `SPARE_SLACK` tokens still left: a closing takes over early
only where none is known after the token the model chose, so these show where
`grammar.shortest` does not model a schema shape. Each is listed with its closing.

    python -m bench.budget --sample 200
    python -m bench.budget --only Glaiveai2K---calculate_area_245ee1e7.json   # named schemas
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.maskbench import DEFAULT_CORPUS, stratified_sample
from bench.provenance import header
from corral.engine import Engine, EngineConfig, SamplingParams
from corral.engine.loading.assets import load_model
from corral.grammar import (
    ConstraintError,
    ConstraintSpec,
    TokenizerInfo,
    compile_constraint,
)
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.core.runtime import BudgetClose

BENCH_DIR = Path(__file__).resolve().parent

EXTRA = (0, 8, 32)
SPARE_SLACK = 40  # tokens left at the end of a steered output that count as "early"
PROMPT = "Reply with one realistic JSON instance for the application's schema, and nothing else."


def cases(files: list[Path], tok: TokenizerInfo, hf) -> tuple[list[tuple], int]:
    """(name, schema, compiled, budget closing, shortest tokens) for each usable schema; and how
    many compiled but had no shortest instance found."""
    out, unmodelled = [], 0
    for path in files:
        schema = json.loads(path.read_text())["schema"]
        try:
            spec = ConstraintSpec.json_schema(schema)
            compiled = compile_constraint(spec, tok)
        except ConstraintError:
            continue
        closer = JsonCloser.for_spec(spec)
        shortest = closer.shortest(closer.root)
        if shortest is None:
            unmodelled += 1
            continue
        need = len(hf.encode(shortest, add_special_tokens=False))
        out.append((path.name, schema, compiled, BudgetClose(closer, tok), need))
    return out, unmodelled


def valid(text: str, schema: dict) -> bool:
    from jsonschema import Draft202012Validator, FormatChecker

    try:
        instance = json.loads(text)
    except json.JSONDecodeError:
        return False
    return Draft202012Validator(schema, format_checker=FormatChecker()).is_valid(instance)


def run(model, prompt: list[int], todo: list[tuple], extra: int, close: bool) -> list:
    engine = Engine(model, EngineConfig(max_num_seqs=64, num_threads=1))
    params = [
        SamplingParams(
            max_tokens=need + extra, temperature=0, budget_close=closer if close else None
        )
        for _, _, _, closer, need in todo
    ]
    # One request per schema, all queued at once (continuous batching).
    ids = [
        engine.add_request(prompt, p, compiled)
        for p, (_, _, compiled, _, _) in zip(params, todo, strict=True)
    ]
    done = engine.run_until_done()
    engine.close()
    return [done[i][0] for i in ids]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sample", type=int, default=200, help="stratified sample of N schemas")
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="+", metavar="FILE", help="these corpus files, not a sample")
    p.add_argument("--spare", type=int, default=0, metavar="N", help="also run at shortest + N")
    args = p.parse_args(argv)
    print(header(__file__))
    model = load_model()
    tok = TokenizerInfo.from_hf(
        model.tokenizer, vocab_size=model.vocab_size, eos_token_ids=model.eos_token_ids
    )
    files = sorted(args.corpus.glob("*.json"))
    if args.only:
        files = [args.corpus / name for name in args.only]
    else:
        files = stratified_sample(files, args.sample, args.seed)
    todo, unmodelled = cases(files, tok, model.tokenizer)
    enc = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    prompt = list(enc["input_ids"] if not isinstance(enc, list) else enc)
    print(
        f"{len(files)} schemas sampled; {len(todo)} compiled with a shortest instance found, "
        f"{unmodelled} compiled without one (not run); default model, greedy"
    )
    print(f"{'max_tokens':>22} {'with closing':>13} {'without':>9} {'steered':>8} {'s':>6}")
    for extra in EXTRA:
        t0 = time.perf_counter()
        got = {c: run(model, prompt, todo, extra, c) for c in (True, False)}
        ok = {c: sum(valid(ch.text, s[1]) for ch, s in zip(got[c], todo, strict=True)) for c in got}
        steered = sum(bool(ch.budget_close and ch.budget_close.steered) for ch in got[True])
        n = len(todo)
        print(
            f"{'shortest + ' + str(extra):>22} {100 * ok[True] / n:>12.1f}% "
            f"{100 * ok[False] / n:>8.1f}% {steered:>8} {time.perf_counter() - t0:>6.0f}"
        )
        for ch, (name, *_rest) in zip(got[True], todo, strict=True):
            if not valid(ch.text, _rest[0]):
                print(f"  invalid with closing: {name} {ch.finish_reason} {ch.budget_close}")
    if args.spare:
        early = []
        for ch, (name, _s, _c, _closer, need) in zip(
            run(model, prompt, todo, args.spare, True), todo, strict=True
        ):
            used = len(model.tokenizer.encode(ch.text, add_special_tokens=False))
            if (
                ch.budget_close
                and ch.budget_close.steered
                and need + args.spare - used > SPARE_SLACK
            ):
                early.append((name, used, ch.budget_close.cut_short))
        print(
            f"shortest + {args.spare}: {len(early)} of {len(todo)} outputs ended by budget closing "
            f"with more than {SPARE_SLACK} tokens left"
        )
        for name, used, cut in early:
            print(f"  {name}: {used} tokens, cut short {list(cut)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
