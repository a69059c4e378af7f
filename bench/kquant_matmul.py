"""Q6_K / Q5_K weights kept quantized (`quant.KQuantWeight`, the `cpu_kquant` kernel) against
what the loader did before: the same tensor dequantized to bfloat16 on oneDNN-packed weights.

Per GGUF type, weight shape (the tensors a Q4_K_M file stores in Q6_K: a 1B Qwen3-like model's
ffn_down, attn_v and output head over the default tokenizer, and a 7-8B model's ffn_down) and row count: the median microseconds of
each, their ratio (bf16 / kquant: above 1 is faster kept quantized), and the bytes each holds.
Random valid blocks (`tests`' factory is not importable from bench, so they are made here the
same way: random bytes, block constants set for weights of ~1/sqrt(K)).

    python -m bench.kquant_matmul [--threads 1,2] [--rows 1,8] [--budget-s 0.1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from bench.provenance import header
from corral.engine.kernels.cpu_kquant import kquant_kernel
from corral.engine.kernels.matmul import pack_weight, packed_linear
from corral.engine.kernels.quant import kquant_from_gguf, kquant_linear

SHAPES = {  # name: (out_features N, in_features K)
    "1B ffn_down": (2048, 6144),
    "1B attn_v": (1024, 2048),
    "1B output": (49152, 2048),
    "8B ffn_down": (4096, 14336),
}


def random_kquant_blocks(qtype: QT, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Valid `qtype` blocks (Q6_K or Q5_K) for an `[n, k]` weight of std ~1/sqrt(k)."""
    size = GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(n, k // 256, size), dtype=np.uint8)
    std = k**-0.5
    if qtype == QT.Q6_K:
        d = rng.uniform(0.5, 1.5, size=(n, k // 256, 1)) * std / (18 * 73)
        b[..., 208:210] = d.astype(np.float16).view(np.uint8)
    else:
        consts = rng.uniform(0.2, 1.0, size=(n, k // 256, 2)) * std / 63
        b[..., 0:4] = consts.astype(np.float16).view(np.uint8)
    return b.reshape(n, -1)


def paired_us(a: Callable, b: Callable, budget_s: float) -> tuple[float, float]:
    """Median microseconds of `a` and of `b`, over 7 rounds that run each in turn (a shared,
    loaded machine slows both alike within a round)."""
    a(), b()
    start = time.perf_counter()
    a()
    n = max(1, int(budget_s / 14 / max(time.perf_counter() - start, 1e-7)))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(7):
        for fn, out in zip((a, b), times, strict=True):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--budget-s", type=float, default=0.1, help="seconds per measurement")
    args = ap.parse_args()
    print(header(__file__))
    if kquant_kernel() is None:
        print("the kquant kernel does not run on this CPU (needs AVX512-VNNI): nothing to compare")
        return
    print(
        f"{'thr':>3} {'type':<5} {'shape':<12} {'N x K':>11} {'rows':>4} {'bf16 us':>9} "
        f"{'kquant us':>9} {'bf16/kq':>7} {'bf16 MiB':>8} {'kq MiB':>7} {'mem ratio':>9}"
    )
    rng = np.random.default_rng(0)
    with torch.inference_mode():
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for qtype in (QT.Q6_K, QT.Q5_K):
                for name, (n, k) in SHAPES.items():
                    w = kquant_from_gguf(random_kquant_blocks(qtype, n, k, rng), qtype)
                    dense = pack_weight(w.dequantized(torch.bfloat16))
                    dense_bytes = n * k * 2
                    for rows in (int(m) for m in args.rows.split(",")):
                        x = torch.randn(rows, k).bfloat16()
                        bf, kq = paired_us(
                            partial(packed_linear, x, dense, None),
                            partial(kquant_linear, x, w, None),
                            args.budget_s,
                        )
                        print(
                            f"{threads:>3} {qtype.name:<5} {name:<12} {f'{n}x{k}':>11} "
                            f"{rows:>4} {bf:>9.0f} {kq:>9.0f} {bf / kq:>7.2f} "
                            f"{dense_bytes / 2**20:>8.1f} {w.nbytes / 2**20:>7.1f} "
                            f"{w.nbytes / dense_bytes:>9.2f}",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
