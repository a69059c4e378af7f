"""The compile and mask costs behind the "Limits" defaults (docs/serving.md).

Three measurements, each the median of ``--repeat`` runs, on the Llama-3 tokenizer (128,256
tokens, the benches' reference) or on the served model's (``--tokenizer default``):

- an object of 5,000 required properties: the compile (analysis, grammar, probe);
- an enum of 10,000 strings: the compile;
- an object of N optional properties (``--optional``, default 1,000 2,000 5,000), which passes
  llguidance's Earley-row limit from about 500 on: Corral's verdict with its limits, then, with
  the row limit lifted through ``CORRAL_LLG_LIMITS`` (the real override), the compile and the
  mask times along the first ``--max-masks`` tokens of an instance that sets every tenth
  property. This is the cost that decides
  where Corral stops raising the limit.

    .venv/bin/python -m bench.limits
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from bench.provenance import header
from corral.grammar import (
    ConstraintError,
    ConstraintSpec,
    JsonFormat,
    TokenizerInfo,
    compile_constraint,
)
from corral.grammar.backends.llg_limits import LIMITS_ENV
from corral.grammar.core.walk import token_allowed

LIFTED = {"max_items_in_row": 1_000_000, "step_max_items": 10_000_000}


def tokenizer(name: str) -> TokenizerInfo:
    if name == "llama3":
        from corral.fuzz.tokenizers import llama3_tokenizer

        return llama3_tokenizer()
    from corral.engine.loading.assets import load_model

    model = load_model(None)
    return TokenizerInfo.from_hf(
        model.tokenizer, vocab_size=model.vocab_size, eos_token_ids=model.eos_token_ids
    )


def required_object(n: int) -> dict:
    props = {f"p{i}": {"type": "integer"} for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)}


def optional_object(n: int) -> dict:
    props = {f"field_{i}": {"type": "integer"} for i in range(n)}
    return {"type": "object", "properties": props, "additionalProperties": False}


def string_enum(n: int) -> dict:
    return {"enum": [f"value number {i}" for i in range(n)]}


def compile_seconds(schema: dict, tok: TokenizerInfo, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        compile_constraint(ConstraintSpec.json_schema(schema), tok)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def verdict(schema: dict, tok: TokenizerInfo) -> str:
    try:
        compile_constraint(ConstraintSpec.json_schema(schema), tok)
    except ConstraintError as e:
        return f"refused (limit {e.limit})"
    return "compiled"


def walk_prefix(m, ids: list[int], bitmask: torch.Tensor, times: list[float]) -> bool:
    """Mask, check and accept each token in turn, timing every mask; True if all went in."""
    for t in ids:
        t0 = time.perf_counter()
        m.fill_mask(bitmask, 0)
        times.append((time.perf_counter() - t0) * 1e6)
        if not token_allowed(bitmask, 0, t) or not m.accept(t):
            return False
    return True


def lifted_walk(n: int, tok: TokenizerInfo, max_masks: int) -> dict:
    """Compile and walk the N-optional-properties object with the row limit lifted; the
    instance is laid out as ``json.dumps`` does, and so is the grammar."""
    schema = optional_object(n)
    os.environ[LIMITS_ENV] = json.dumps(LIFTED)
    try:
        t0 = time.perf_counter()
        spec = ConstraintSpec.json_schema(schema, json_format=JsonFormat.python_default())
        compiled = compile_constraint(spec, tok)
        build = time.perf_counter() - t0
        data = {f"field_{i}": i for i in range(0, n, 10)}
        ids = tok.encode(json.dumps(data))[:max_masks]  # a prefix: masks are judged, not the end
        bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
        times: list[float] = []
        ok = walk_prefix(compiled.matcher(), ids, bitmask, times)
    finally:
        del os.environ[LIMITS_ENV]
    times.sort()
    return {
        "build_s": build,
        "walked": ok,
        "masks": len(times),
        "p50_ms": times[len(times) // 2] / 1e3,
        "p90_ms": times[len(times) * 9 // 10] / 1e3,
        "max_ms": times[-1] / 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", choices=("llama3", "default"), default="llama3")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--optional", type=int, nargs="*", default=[1000, 2000, 5000])
    ap.add_argument("--max-masks", type=int, default=400, help="masks walked per object")
    args = ap.parse_args(argv)
    tok = tokenizer(args.tokenizer)
    print(f"{header(__file__)}, tokenizer {args.tokenizer} ({tok.vocab_size} logits), "
          f"{torch.get_num_threads()} torch threads")  # fmt: skip
    req = compile_seconds(required_object(5000), tok, args.repeat)
    print(f"5,000 required properties: compile {req:.2f} s (median of {args.repeat})")
    enum = compile_seconds(string_enum(10_000), tok, args.repeat)
    print(f"enum of 10,000 strings: compile {enum:.3f} s (median of {args.repeat})")
    for n in args.optional:
        print(f"{n:,} optional properties: {verdict(optional_object(n), tok)}")
        w = lifted_walk(n, tok, args.max_masks)
        print(f"  row limit lifted: build {w['build_s']:.2f} s, prefix walked {w['walked']}, "
              f"{w['masks']} masks, p50 {w['p50_ms']:.1f} ms, p90 {w['p90_ms']:.1f} ms, max {w['max_ms']:.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
