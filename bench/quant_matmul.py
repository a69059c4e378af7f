"""Decode-shaped matmuls: packed low-bit weights (torch's CPU weight-only kernels) vs float32.

Per weight shape (SmolLM2-135M's four layer matmuls and LM head, and a 4096x4096 layer of a
7-8B model) and row count, the median microseconds of:

    fp32    `matmul.packed_linear` on oneDNN-packed float32 weights (what the engine runs today)
    bf16    the same on oneDNN-packed bfloat16 weights
    int8    `quant.int8_linear`: `aten._weight_int8pack_mm`, per-row scales, bf16 activations
    int4    `quant.int4_linear`: `aten._weight_int4pack_mm_for_cpu`, group 32, bf16 activations
            (Q4_0 / Q4_1 / Q4_K)
    int4x2  the same with the input doubled along K: how Q8_0 maps exactly
    i4-f32  int4 with float32 activations and scales (exact; a scalar loop on x86), 1 row only

Times include the casts to and from bfloat16 that the engine would pay. Ratios are fp32 / ours.

    python -m bench.quant_matmul [--threads 1,2] [--rows 1,2,4,8] [--budget-s 0.1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench.provenance import header
from corral.engine.kernels.matmul import pack_weight, packed_linear
from corral.engine.kernels.quant import GROUP, Int4Weight, Int8Weight, int4_linear, int8_linear

SHAPES = {  # name: (out_features N, in_features K)
    "smollm2 qkv": (960, 576),
    "smollm2 o": (576, 576),
    "smollm2 gate_up": (3072, 576),
    "smollm2 down": (576, 1536),
    "smollm2 lm_head": (49152, 576),
    "8B-like layer": (4096, 4096),
}


def median_us(fn: Callable[[], object], budget_s: float) -> float:
    """Median of 5 repeats of a loop sized to take about `budget_s / 5` each."""
    fn()
    start = time.perf_counter()
    fn()
    n = max(1, int(budget_s / 5 / max(time.perf_counter() - start, 1e-7)))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n)
    return statistics.median(times) * 1e6


def random_int4(n: int, k: int, dtype: torch.dtype, split: bool = False) -> Int4Weight:
    kk = 2 * k if split else k
    q = torch.randint(0, 16, (n, kk), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack((torch.rand(kk // GROUP, n) * 0.02, torch.randn(kk // GROUP, n) * 0.01), -1)
    return Int4Weight(packed, sz.to(dtype), n, k, split_input=split)


def row(n: int, k: int, rows: int, budget_s: float) -> dict[str, float]:
    x = torch.randn(rows, k)
    w32 = torch.randn(n, k) * 0.02
    p32, p16 = pack_weight(w32), pack_weight(w32.bfloat16())
    i8 = Int8Weight(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n).bfloat16())
    i4, i4x2 = random_int4(n, k, torch.bfloat16), random_int4(n, k, torch.bfloat16, split=True)
    xb = x.bfloat16()
    r = {
        "fp32": median_us(lambda: packed_linear(x, p32, None), budget_s),
        "bf16": median_us(lambda: packed_linear(xb, p16, None), budget_s),
        "int8": median_us(lambda: int8_linear(x, i8, None), budget_s),
        "int4": median_us(lambda: int4_linear(x, i4, None), budget_s),
        "int4x2": median_us(lambda: int4_linear(x, i4x2, None), budget_s),
    }
    if rows == 1:
        i4f = random_int4(n, k, torch.float32)
        r["i4-f32"] = median_us(lambda: int4_linear(x, i4f, None), budget_s)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--budget-s", type=float, default=0.1, help="seconds per measurement")
    args = ap.parse_args()
    print(header(__file__))
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    cols = ("fp32", "bf16", "int8", "int4", "int4x2", "i4-f32")
    print(
        f"{'thr':>3} {'shape':<16} {'N x K':>12} {'rows':>4} "
        + " ".join(f"{c + ' us':>10}" for c in cols)
        + f" {'fp32/int8':>9} {'fp32/int4':>9}"
    )
    with torch.inference_mode():
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for name, (n, k) in SHAPES.items():
                for rows in (int(m) for m in args.rows.split(",")):
                    r = row(n, k, rows, args.budget_s)
                    cells = " ".join(f"{r[c]:>10.0f}" if c in r else f"{'-':>10}" for c in cols)
                    print(
                        f"{threads:>3} {name:<16} {f'{n}x{k}':>12} {rows:>4} {cells} "
                        f"{r['fp32'] / r['int8']:>9.2f} {r['fp32'] / r['int4']:>9.2f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
