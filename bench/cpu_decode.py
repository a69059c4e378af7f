"""CPU decode step with the C decode kernels (`corral.engine.kernels.cpu_kernels`) on vs off.

    python -m bench.cpu_decode [--context 400] [--steps 64] [--rounds 5] [--threads N]

The default model as `corral serve` runs it on the CPU (GGUF int4 matmuls, bfloat16 activations),
batch 1, a prompt of `--context` tokens. Prints, kernels on ("ours") beside off (the torch ops,
"torch") and the ratio:
1. the forward pass alone of one decode step (`ModelRunner.forward`, median over steps);
2. the whole engine step: time per output token of a greedy `Engine.generate` of `--steps`
   tokens after a first token (prefill) measured separately, per fresh engine.
Both sides alternate round by round, so a change in machine load hits both.
For quiet figures run it as `nice -n -20` with nothing else running.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

import torch

from bench.provenance import header
from corral.api.config import ServerConfig
from corral.engine import Engine, SamplingParams, load_model
from corral.engine.execution.batch import ForwardBatch
from corral.engine.kernels import cpu_kernels
from corral.engine.serving.config import available_cores

SIDES = {"ours": "1", "torch": "0"}  # CORRAL_CPU_KERNELS for each side


def forward_ms(model, prompt: list[int], steps: int) -> float:
    """Median ms of one batch-1 decode forward at the prompt's length (the prompt prefilled
    once; every step rewrites the same next slot)."""
    runner = model.runner
    pool = runner.make_kv_pool(len(prompt) + 2)
    kv = pool.alloc(len(prompt))
    runner.forward(ForwardBatch.from_sequences([prompt], [kv]), pool)
    kv = torch.cat((kv, pool.alloc(1)))
    batch = ForwardBatch.from_sequences([[prompt[-1]]], [kv])
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        runner.forward(batch, pool)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def step_ms(model, prompt: list[int], steps: int, threads: int) -> float:
    """ms per output token of a greedy batch-1 generate, prefill excluded."""
    config = replace(ServerConfig().engine_config(), num_threads=threads)

    def run(tokens: int) -> float:
        eng = Engine(model, config)  # a cold prefix cache for every run
        t = time.perf_counter()
        eng.generate([prompt], SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
        dt = time.perf_counter() - t
        eng.close()
        return dt

    return 1e3 * (run(steps + 1) - run(1)) / steps


def row(name: str, ours: list[float], peer: list[float]) -> None:
    a, b = statistics.median(ours), statistics.median(peer)
    print(f"{name:<40} ours {a:8.3f} ms   torch {b:8.3f} ms   ratio {a / b:5.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--context", type=int, default=400, help="prompt tokens before decoding")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per measurement")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per side")
    ap.add_argument("--threads", type=int, default=available_cores(), help="torch threads")
    args = ap.parse_args()
    print(header(__file__), flush=True)
    torch.set_num_threads(args.threads)
    if cpu_kernels.library() is None:
        raise SystemExit("the CPU kernels did not build (see the log line above)")
    model = load_model(quantize="gguf", dtype=torch.bfloat16)
    text = " ".join(f"Item {i} is a small fact about rivers and hills." for i in range(200))
    prompt = model.tokenizer(text)["input_ids"][: args.context]
    print(
        f"default model, gguf int4 + bfloat16, batch 1, context {len(prompt)}, "
        f"{args.threads} threads, {args.rounds} rounds",
        flush=True,
    )
    fwd: dict[str, list[float]] = {side: [] for side in SIDES}
    step: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side, switch in SIDES.items():
            os.environ[cpu_kernels.SWITCH_ENV] = switch
            fwd[side].append(forward_ms(model, prompt, args.steps))
            step[side].append(step_ms(model, prompt, args.steps, args.threads))
    row("decode forward (batch 1)", fwd["ours"], fwd["torch"])
    row("decode step, per output token (batch 1)", step["ours"], step["torch"])


if __name__ == "__main__":
    main()
