"""Part b of bench/gpu_engine.py: decode throughput of a random-weight Llama-3.1-8B-shaped model
beside the HBM roofline (weight + KV bytes per step over the measured copy bandwidth), and at
batch 64 the same decode with every row under a grammar mask beside it unconstrained (what the
mask fill, its copy and the masked sampling cost per step; rows deferred by the mask deadline
are counted).
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.gpu_models import (
    SHAPES,
    Summary,
    engine_config,
    llama_config,
    loaded,
    random_model,
    runner_for,
    sync,
)
from corral.engine import Engine, SamplingParams
from corral.engine.execution.model_config import ModelConfig
from corral.engine.kvcache.kv_pool import KVPool
from corral.fuzz.tokenizers import LLAMA3_EOS_TOKEN_IDS, LLAMA3_VOCAB_SIZE
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

WARM_STEPS = 4  # decode steps dropped per batch: Triton compiles, graph captures


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a device-to-device copy_, counting the read and the write."""
    n = (4 << 30) if device == "cuda" else (128 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * n / statistics.median(times)


def weight_bytes(c: ModelConfig, batch: int, elem: int) -> int:
    """Bytes one decode step reads: every matmul weight and norm, `batch` embedding rows."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layer = (
        c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    )
    layer += 2 * c.hidden_size
    return elem * (c.num_layers * layer + (c.vocab_size + 1 + batch) * c.hidden_size)


def decode_run(
    eng: Engine, prompts: list[list[int]], new: int, device: str, constraint=None
) -> list[tuple]:
    """(seconds, KV tokens read) of every decode-only step: all sequences have their first
    token, and the step fed exactly one token per sequence. `constraint`: every request is
    constrained by it (it must not end before `new` tokens)."""
    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    counts = {eng.add_request(p, params, constraint): 0 for p in prompts}
    steps = []
    while eng.has_unfinished():
        decoding = all(counts.values())
        kv_read = sum(len(prompts[0]) + c for c in counts.values() if c < new)
        fed = eng.stats()["batched_tokens"]
        sync(device)
        t = time.perf_counter()
        outs = eng.step()
        sync(device)
        dt = time.perf_counter() - t
        for o in outs:
            counts[o.request_id] += len(o.token_ids)
        if decoding and eng.stats()["batched_tokens"] - fed == len(outs) == len(prompts):
            steps.append((dt, kv_read))
    if any(c != new for c in counts.values()):
        raise RuntimeError(
            f"expected {new} tokens per sequence, got {sorted(set(counts.values()))}"
        )
    return steps


def part_b(summary: Summary, args, tok) -> None:
    device, shape = args.device, ("8b" if args.device == "cuda" else "tiny")
    batches = (1, 8, 64, 256) if device == "cuda" else (1, 8)
    prompt_len, new = (128, 32) if args.quick else (512, 128)
    if args.quick and device == "cuda":
        batches = batches[:3]
    dtype, c = torch.bfloat16, llama_config(shape)
    bw = copy_bandwidth(device)
    t = time.perf_counter()
    runner = runner_for(random_model(c, dtype, device, seed=1))
    slot = KVPool.slot_bytes(c.num_layers, c.num_kv_heads, c.head_dim, dtype)
    kv_bytes = (max(batches) * (prompt_len + new) + 1024) * slot
    eng = Engine(
        loaded(runner, tok, f"random-llama-{shape}"),
        engine_config(
            kv_cache_bytes=kv_bytes,
            max_num_seqs=max(batches),
            max_batched_tokens=8192,
            prefix_cache=False,
        ),
    )
    print(
        f"b. {shape} model {SHAPES[shape]} bf16 on {device}, built in "
        f"{time.perf_counter() - t:.1f} s; KV pool {kv_bytes / 2**30:.1f} GiB; copy bandwidth "
        f"{bw / 1e9:.0f} GB/s; prompts {prompt_len}, {new} new tokens"
    )
    summary.figure("b", "copy bandwidth (read + write)", f"{bw / 1e9:.0f} GB/s", "", "")
    gen = torch.Generator().manual_seed(3)
    start, tpot, last, prev_b = time.monotonic(), {}, None, 1
    for b in batches:
        spent = time.monotonic() - start
        if last is not None and spent + last * b / prev_b > args.budget_s:
            print(f"  budget of {args.budget_s:.0f} s: batch {b} skipped after {spent:.0f} s")
            summary.figure("b", f"decode batch {b}: TPOT", "skipped (--budget-s)", "", "")
            continue
        t = time.monotonic()
        prompts = torch.randint(0, 128000, (b, prompt_len), generator=gen).tolist()
        steps = decode_run(eng, prompts, new, device)[WARM_STEPS:]
        last, prev_b = time.monotonic() - t, b
        tpot[b] = statistics.median(dt for dt, _ in steps)
        kv_mid = statistics.median(kv for _, kv in steps)
        roof = (weight_bytes(c, b, 2) + kv_mid * slot) / bw
        summary.figure(
            "b",
            f"decode batch {b}: TPOT",
            f"{tpot[b] * 1e3:.2f} ms, {b / tpot[b]:.0f} tok/s ({len(steps)} steps)",
            f"roofline {roof * 1e3:.2f} ms, {b / roof:.0f} tok/s",
            f"{roof / tpot[b]:.2f} of roofline",
        )
        if b == 64:
            if time.monotonic() - start + last > args.budget_s:
                summary.figure("b", CONSTRAINED_ROW, "skipped (--budget-s)", "", "")
            else:
                constrained_figure(summary, eng, tok, prompt_len, new, device, tpot[64])
    eng.close()
    top = 64 if 64 in tpot else max(tpot, default=1)
    if 1 in tpot and top != 1:
        summary.figure("b", f"TPOT({top}) / TPOT(1)", f"{tpot[top] / tpot[1]:.2f}", "", "")


# Lowercase letters only, more of them than `new` tokens can hold (Llama-3's longest all-letter
# tokens are ~20 characters): every row is masked at every step and none ends early.
CONSTRAINED_REGEX = "[a-z]{4096}"
CONSTRAINED_ROW = "decode batch 64, every row constrained: TPOT"


def constrained_figure(
    summary: Summary, eng: Engine, tok, prompt_len: int, new: int, device: str, free_tpot: float
) -> None:
    """Decode TPOT at batch 64 with every row under a grammar mask, beside the same batch
    unconstrained (`free_tpot`, measured just before): what masks cost per step."""
    info = TokenizerInfo.from_hf(
        tok, vocab_size=LLAMA3_VOCAB_SIZE, eos_token_ids=list(LLAMA3_EOS_TOKEN_IDS)
    )
    constraint = compile_constraint(ConstraintSpec.regex(CONSTRAINED_REGEX), info)
    gen = torch.Generator().manual_seed(4)
    prompts = torch.randint(0, 128000, (64, prompt_len), generator=gen).tolist()
    steps = decode_run(eng, prompts, new, device, constraint)[WARM_STEPS:]
    got = statistics.median(dt for dt, _ in steps)
    summary.figure(
        "b",
        CONSTRAINED_ROW,
        f"{got * 1e3:.2f} ms ({len(steps)} steps, {eng.counters['mask_deferrals']} rows deferred)",
        f"unconstrained {free_tpot * 1e3:.2f} ms",
        f"{got / free_tpot:.2f}x",
    )
