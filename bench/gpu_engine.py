"""GPU check of the whole engine: a smoke test, bf16 logits parity, decode throughput vs roofline.

    python -m bench.gpu_engine --device cuda [--quick] [--budget-s 200] [--parts abc]
    python -m bench.gpu_engine --device cpu --quick     # the same code paths at tiny shapes

a. Smoke: a 2-layer random-weight Llama with Llama-3's real tokenizer (128,256 logits), bf16 on
   the device (fp32 on the CPU), one engine batch of >= 20 steps mixing a json_schema request, a
   regex request, a greedy request with presence/frequency penalties, a seeded sampled request
   twice, and an n=2 request. The JSON output is validated (Draft 2020-12), the regex one
   fullmatched, the penalised one must repeat no token, the seeded twins must agree, and the whole
   batch run again in a fresh engine must give the same tokens.
   Parity: the same weights in CPU fp32 vs the device in bf16 (on --device cpu: CPU bf16), over a
   prefill, an extend over a cached prefix and a decode step: max and mean |diff| of the logits
   against BF16_TOL / BF16_MEAN_TOL, top-1 agreement (a flip within BF16_TOL is allowed).
b. Decode throughput: a random-weight Llama-3.1-8B-shaped model (tiny on --device cpu) in bf16,
   batches 1/8/64/256, 512-token random prompts, 128 greedy tokens each (ignore_eos). TPOT is the
   median over decode-only steps after WARM_STEPS; beside it the HBM roofline: (weight bytes + KV
   bytes read) per step / the bandwidth of a device-to-device copy_ measured here (read + write).
   --quick: 128-token prompts, 32 new tokens, batches 1/8/64 (on the CPU always 1/8).
   --budget-s: part b skips a batch that would end past it (estimated from the previous one).
c. Serving speed, each switch on vs off (`bench/gpu_serving.py`): CUDA graphs at batch 1 and 8,
   overlap scheduling at batch 8, MaskBench-constrained vs unconstrained at batch 64 (`--maskbench`
   folder; skipped without one). `--parts`: which of a, b, c run (default all).

Prints the provenance header, then one summary table; exit status 1 when a check failed. Writes
no files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback

import torch
from jsonschema import Draft202012Validator
from transformers import PreTrainedTokenizerFast

from bench.gpu_decode import part_b
from bench.gpu_models import (
    SHAPES,
    Summary,
    engine_config,
    llama_config,
    loaded,
    random_model,
    runner_for,
)
from bench.gpu_serving import part_c
from bench.provenance import header
from corral.engine import Engine, SamplingParams
from corral.engine.execution.batch import ForwardBatch
from corral.engine.execution.model import DecoderModel
from corral.engine.execution.model_runner import ModelRunner
from corral.engine.loading.assets import LoadedModel
from corral.fuzz.tokenizers import LLAMA3_EOS_TOKEN_IDS, LLAMA3_VOCAB_SIZE, llama3_tokenizer_path
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

# bf16 keeps 8 significant bits; logits of std ~1 after ~20 roundings. CPU bf16 vs fp32 gives
# max 0.089, mean 0.010 on the parity rows; leaving one slot out of a 130-slot decode (fp32)
# moves its row by max 1.6, mean 0.26.
BF16_TOL = 0.15  # max |logit diff| vs fp32; also the top-1 slack
BF16_MEAN_TOL = 0.02  # mean |logit diff|
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "count", "ok", "color"],
    "additionalProperties": False,
}
PATTERN = r"(yes|no)-[0-9]{2,4}-[a-z]{1,6}"


# ---- models -----------------------------------------------------------------------------------


# ---- a. smoke test and parity -----------------------------------------------------------------


def smoke_requests(tok, tokinfo) -> list[tuple[str, list[int], SamplingParams, object]]:
    """(label, prompt, params, constraint) of the smoke batch."""
    greedy = SamplingParams(max_tokens=200, temperature=0)
    penalised = SamplingParams(
        max_tokens=32, temperature=0, presence_penalty=2.0, frequency_penalty=2.0, ignore_eos=True
    )
    seeded = SamplingParams(max_tokens=32, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    two = SamplingParams(max_tokens=24, temperature=1.0, seed=99, n=2, ignore_eos=True)
    json_c = compile_constraint(ConstraintSpec.json_schema(SCHEMA), tokinfo)
    regex_c = compile_constraint(ConstraintSpec.regex(PATTERN), tokinfo)
    rows = [
        ("json", "Reply with a JSON object:", greedy, json_c),
        ("regex", "Answer yes or no, a number and a word:", greedy, regex_c),
        ("penalties", "Write a list of different words:", penalised, None),
        ("seeded", "Tell me a story about a dragon.", seeded, None),
        ("seeded twin", "Tell me a story about a dragon.", seeded, None),
        ("n=2", "Two different answers, please:", two, None),
    ]
    return [(label, tok.encode(text, add_special_tokens=False), p, c) for label, text, p, c in rows]


def run_batch(model: LoadedModel, tokinfo, requests) -> tuple[dict, int]:
    """({label: choices}, engine steps) of one batch in a fresh engine; checks KV integrity."""
    config = engine_config(kv_cache_bytes=64 << 20, max_num_seqs=16, max_batched_tokens=1024)
    eng = Engine(model, config, tokinfo.fingerprint)
    rids = {label: eng.add_request(p, sp, c) for label, p, sp, c in requests}
    results = eng.run_until_done()
    eng.check_integrity()
    steps = int(eng.stats()["steps"])
    eng.close()
    return {label: results[rid] for label, rid in rids.items()}, steps


def valid_json(text: str) -> bool:
    try:
        return Draft202012Validator(SCHEMA).is_valid(json.loads(text))
    except json.JSONDecodeError:
        return False


def smoke(summary: Summary, model: LoadedModel, tok, tokinfo) -> None:
    requests = smoke_requests(tok, tokinfo)
    t = time.perf_counter()
    out, steps = run_batch(model, tokinfo, requests)
    dt = time.perf_counter() - t
    again, _ = run_batch(model, tokinfo, requests)
    js, rx = out["json"][0], out["regex"][0]
    pen = out["penalties"][0].token_ids
    a, b = out["seeded"][0].token_ids, out["seeded twin"][0].token_ids
    n2 = [c.token_ids for c in out["n=2"]]
    pairs = [(c, d) for k in out for c, d in zip(out[k], again[k], strict=True)]
    same = sum(c.token_ids == d.token_ids for c, d in pairs)
    checks = [
        ("engine steps in one batch", steps >= 20, f"{steps} steps, {dt:.1f} s", ">= 20"),
        (
            "json_schema request",
            js.finish_reason == "stop" and valid_json(js.text),
            f"{js.finish_reason}, {js.text[:36]!r}",
            "stop, Draft 2020-12 valid",
        ),
        (
            "regex request",
            rx.finish_reason == "stop" and re.fullmatch(PATTERN, rx.text) is not None,
            f"{rx.finish_reason}, {rx.text!r}",
            "stop, re.fullmatch",
        ),
        (
            "presence+frequency penalties",
            len(pen) == 32 == len(set(pen)),
            f"{len(set(pen))} distinct of {len(pen)} tokens",
            "32 of 32 (greedy)",
        ),
        (
            "seeded twins, same batch",
            a == b and len(a) == 32,
            f"{len(a)} tokens, equal: {a == b}",
            "32 tokens, equal",
        ),
        (
            "n=2 request",
            [len(c) for c in n2] == [24, 24] and n2[0] != n2[1],
            f"{[len(c) for c in n2]} tokens, differ: {n2[0] != n2[1]}",
            "[24, 24], differ",
        ),
        (
            "same batch, fresh engine",
            same == len(pairs),
            f"{same}/{len(pairs)} choices equal",
            "all equal",
        ),
    ]
    for what, ok, ours, ref in checks:
        summary.check("a", what, ok, ours, ref)


def parity_logits(runner: ModelRunner, prompts: list[list[int]], more: list[list[int]]):
    """Float32 CPU logits of every row of: the prompts' prefill, an extend by `more[s][:-1]`
    over the cached prompt, and a decode of `more[s][-1]`."""
    pool = runner.make_kv_pool(sum(map(len, prompts)) + sum(map(len, more)) + 1)
    kv = [pool.alloc(len(p)) for p in prompts]
    rows = lambda chunks: torch.arange(sum(map(len, chunks)))  # noqa: E731
    out = [runner.forward(ForwardBatch.from_sequences(prompts, kv, rows(prompts)), pool)]
    ext = [m[:-1] for m in more]
    kv = [torch.cat([k, pool.alloc(len(e))]) for k, e in zip(kv, ext, strict=True)]
    out.append(runner.forward(ForwardBatch.from_sequences(ext, kv, rows(ext)), pool))
    kv = [torch.cat([k, pool.alloc(1)]) for k in kv]
    out.append(runner.forward(ForwardBatch.from_sequences([m[-1:] for m in more], kv), pool))
    return torch.cat([o.float().cpu() for o in out])


def parity(summary: Summary, ref: ModelRunner, dev: ModelRunner, label: str) -> None:
    gen = torch.Generator().manual_seed(7)
    ids = lambda n: torch.randint(0, 128000, (n,), generator=gen).tolist()  # noqa: E731
    prompts, more = [ids(7), ids(40), ids(129)], [ids(6), ids(17), ids(3)]
    want = parity_logits(ref, prompts, more)
    got = parity_logits(dev, prompts, more)
    diff = (want - got).abs()
    worst, mean = diff.max().item(), diff.mean().item()
    top = got.argmax(-1)
    exact = (top == want.argmax(-1)).float().mean().item()
    # a flip between two logits closer than the tolerance is rounding, not a bug
    near = (want.gather(1, top[:, None])[:, 0] >= want.max(-1).values - BF16_TOL).all().item()
    ok = worst <= BF16_TOL and mean <= BF16_MEAN_TOL and bool(near)
    summary.check(
        "a",
        f"logits parity, {label}",
        ok,
        f"|diff| max {worst:.3f} mean {mean:.4f}, {want.shape[0]} rows, top-1 {exact:.0%}",
        f"tol {BF16_TOL} / {BF16_MEAN_TOL}, top-1 in tol",
    )


def part_a(summary: Summary, device: str, tok, tokinfo) -> None:
    config = llama_config("smoke")
    ref_model = random_model(config, torch.float32, "cpu", seed=0)
    dev_model = DecoderModel(config, torch.bfloat16, device)
    with torch.no_grad():  # the same weights, cast, before packing drops the dense ones
        for p, q in zip(ref_model.parameters(), dev_model.parameters(), strict=True):
            q.copy_(p)
    ref, dev = runner_for(ref_model), runner_for(dev_model)
    print(f"a. smoke model {SHAPES['smoke']}; {device} runner: {type(dev.attention).__name__}")
    parity(summary, ref, dev, f"cpu fp32 vs {device} bf16")
    smoke(
        summary, loaded(dev if device == "cuda" else ref, tok, "random-llama-smoke"), tok, tokinfo
    )


# ---- b. decode throughput ---------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), required=True)
    ap.add_argument("--quick", action="store_true", help="shorter prompts and outputs")
    ap.add_argument("--budget-s", type=float, default=200.0, help="part b: skip batches past it")
    ap.add_argument("--maskbench", help="part c: MaskBench schema folder (default: shared corpus)")
    ap.add_argument("--parts", default="abc", help="which parts to run (default abc)")
    args = ap.parse_args()
    print(header(__file__), flush=True)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"no CUDA device here (torch {torch.__version__}): use --device cpu")
        print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    tok = PreTrainedTokenizerFast(tokenizer_file=llama3_tokenizer_path())
    tokinfo = TokenizerInfo.from_hf(
        tok, vocab_size=LLAMA3_VOCAB_SIZE, eos_token_ids=list(LLAMA3_EOS_TOKEN_IDS)
    )
    summary = Summary()
    parts = (
        ("a", lambda: part_a(summary, args.device, tok, tokinfo)),
        ("b", lambda: part_b(summary, args, tok)),
        ("c", lambda: part_c(summary, args, tok)),
    )
    for name, part in parts:
        if name not in args.parts:
            continue
        t = time.perf_counter()
        try:
            part()
        except Exception as e:  # noqa: BLE001 - a broken part is a row; the next part still runs
            traceback.print_exc()
            summary.check(name, "part raised", False, f"{type(e).__name__}: {str(e)[:80]}")
        print(f"part {name}: {time.perf_counter() - t:.1f} s", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    summary.print()
    sys.exit(1 if summary.failed else 0)


if __name__ == "__main__":
    main()
