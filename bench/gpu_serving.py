"""Part c of bench/gpu_engine.py: the engine at serving speed, each switch on vs off.

The same random-weight model as part b (Llama-3.1-8B-shaped on CUDA, tiny on the CPU), bf16,
one fresh engine per run over one runner, so each pair differs in the one switch only:

- CUDA graphs on vs off (`EngineConfig.cuda_graphs`): decode TPOT at batch 1 and 8 (CUDA only;
  on the CPU the switch does nothing and the row says so);
- overlap scheduling on vs off (`EngineConfig.overlap`): decode TPOT at batch 8;
- MaskBench-constrained vs unconstrained at batch 64 (8 on the CPU): every request under its
  own MaskBench schema (cycled over the first that compile; `--maskbench`, default the shared
  corpus, else the row is skipped), greedy, so rows end when their JSON does. TPOT is the median
  over decode-only steps that still hold at least 3/4 of the batch, beside the same prompts
  unconstrained; the rows the mask deadline deferred are counted.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from bench.gpu_decode import WARM_STEPS, decode_run
from bench.gpu_models import (
    Summary,
    engine_config,
    llama_config,
    loaded,
    random_model,
    runner_for,
    sync,
)
from corral.engine import Engine, SamplingParams
from corral.engine.execution.model_runner import ModelRunner
from corral.engine.kvcache.kv_pool import KVPool
from corral.fuzz.tokenizers import LLAMA3_EOS_TOKEN_IDS, LLAMA3_VOCAB_SIZE
from corral.grammar import ConstraintError, ConstraintSpec, TokenizerInfo, compile_constraint

DEFAULT_MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench"


def part_c(summary: Summary, args, tok) -> None:
    device, shape = args.device, ("8b" if args.device == "cuda" else "tiny")
    prompt_len, new = (128, 32) if args.quick else (512, 128)
    c = llama_config(shape)
    runner = runner_for(random_model(c, torch.bfloat16, device, seed=1))
    slot = KVPool.slot_bytes(c.num_layers, c.num_kv_heads, c.head_dim, torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    prompts = lambda b: torch.randint(0, 128000, (b, prompt_len), generator=gen).tolist()  # noqa: E731

    def tpot(batch: list[list[int]], **switches) -> float:
        eng = _engine(runner, tok, len(batch), (prompt_len + new) * slot, **switches)
        try:
            steps = decode_run(eng, batch, new, device)[WARM_STEPS:]
        finally:
            eng.close()
        return statistics.median(dt for dt, _ in steps)

    print(f"c. {shape} model bf16 on {device}; prompts {prompt_len}, {new} new tokens")
    for b in (1, 8):
        if device != "cuda":
            summary.figure("c", f"CUDA graphs on/off, batch {b}", "needs CUDA", "", "")
            continue
        batch = prompts(b)
        on, off = tpot(batch, cuda_graphs=True), tpot(batch, cuda_graphs=False)
        summary.figure(
            "c",
            f"CUDA graphs on vs off, batch {b}: TPOT",
            f"on {on * 1e3:.2f} ms",
            f"off {off * 1e3:.2f} ms",
            f"{on / off:.2f}x",
        )
    batch = prompts(8)
    on, off = tpot(batch, overlap=True), tpot(batch, overlap=False)
    summary.figure(
        "c", "overlap on vs off, batch 8: TPOT", f"on {on * 1e3:.2f} ms", f"off {off * 1e3:.2f} ms",
        f"{on / off:.2f}x",
    )  # fmt: skip
    maskbench_figure(summary, args, runner, tok, prompts(64 if device == "cuda" else 8), new, slot)


def _engine(runner: ModelRunner, tok, batch: int, seq_bytes: int, **switches) -> Engine:
    config = engine_config(
        kv_cache_bytes=batch * seq_bytes + (64 << 20),
        max_num_seqs=batch,
        max_batched_tokens=8192,
        prefix_cache=False,
        **switches,
    )
    return Engine(loaded(runner, tok, "random-llama"), config)


def maskbench_constraints(folder: Path, info: TokenizerInfo, count: int) -> list:
    """The compiled constraints of the first `count` MaskBench schemas that compile."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            out.append(
                compile_constraint(
                    ConstraintSpec.json_schema(json.loads(path.read_text())["schema"]), info
                )
            )
        except (ConstraintError, ValueError, KeyError):
            continue
        if len(out) == count:
            break
    return out


def maskbench_figure(
    summary: Summary, args, runner: ModelRunner, tok, prompts: list[list[int]], new: int, slot: int
) -> None:
    row = f"batch {len(prompts)}, each row its own MaskBench schema: TPOT"
    folder = Path(args.maskbench) if args.maskbench else DEFAULT_MASKBENCH
    if not folder.is_dir():
        summary.figure("c", row, f"skipped: no MaskBench corpus at {folder}", "", "")
        return
    info = TokenizerInfo.from_hf(
        tok, vocab_size=LLAMA3_VOCAB_SIZE, eos_token_ids=list(LLAMA3_EOS_TOKEN_IDS)
    )
    constraints = maskbench_constraints(folder, info, len(prompts))
    prompts = prompts[: len(constraints)]
    seq_bytes = (len(prompts[0]) + new) * slot
    times = {}
    for label, cs in (("constrained", constraints), ("free", [None] * len(constraints))):
        eng = _engine(runner, tok, len(prompts), seq_bytes)
        try:
            times[label] = full_batch_steps(eng, prompts, cs, new, args.device)
            deferred = eng.counters["mask_deferrals"]
        finally:
            eng.close()
    got, free = (statistics.median(times[k]) for k in ("constrained", "free"))
    summary.figure(
        "c",
        row,
        f"{got * 1e3:.2f} ms ({len(times['constrained'])} steps, {deferred} rows deferred)",
        f"unconstrained {free * 1e3:.2f} ms",
        f"{got / free:.2f}x",
    )


def full_batch_steps(
    eng: Engine, prompts: list[list[int]], constraints: list, new: int, device: str
) -> list[float]:
    """Seconds of each decode-only step (one token per sequence: no prefill, no jump-forward
    draft; after WARM_STEPS) while at least 3/4 of the batch still runs; constrained rows end
    where their grammar does."""
    params = SamplingParams(max_tokens=new, temperature=0)
    n = len(prompts)
    for p, c in zip(prompts, constraints, strict=True):
        eng.add_request(p, params, c)
    steps, started = [], set()
    while eng.has_unfinished():
        fed = eng.stats()["batched_tokens"]
        live = len(eng.live_sequences())
        sync(device)
        t = time.perf_counter()
        outs = eng.step()
        sync(device)
        dt = time.perf_counter() - t
        decoding = len(started) == n and eng.stats()["batched_tokens"] - fed == live
        started.update(o.request_id for o in outs)
        if decoding and live * 4 >= 3 * n:
            steps.append(dt)
    return steps[WARM_STEPS:] or [float("nan")]
