"""Benchmark the mask kernels against their peers, measured in the same run.

CUDA (default when a GPU is present): ``apply_bitmask_`` vs xgrammar's
``apply_token_bitmask_inplace`` (its Triton and CUDA kernels) and a plain-torch unpack+masked_fill;
``sample`` vs plain torch (mask, softmax, multinomial). Times are medians of CUDA-event timings.
Beside each: a device-to-device copy of the logits from the same run, the ratio to the best
peer, and the floor = the fewest bytes the operation must move over the copy's bandwidth:

    apply:  the mask + one write per disallowed token (the logits need not be read)
    sample: the mask + one read of the logits

CPU (``--device cpu``): our torch path vs xgrammar's CPU kernel and the plain-torch version,
with ``perf_counter`` medians, single-threaded by default (``--threads``) like xgrammar's kernel.

    python -m bench.bitmask_kernels [--device cpu|cuda] [--quick] [--budget-s 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench.provenance import header
from corral.mask_kernels import SamplingTensors, apply_bitmask_, sample
from corral.mask_kernels.bitmask_torch import apply_bitmask_torch_

BATCHES = (1, 8, 64, 512, 4096)
VOCABS = (32000, 128256, 151936, 262144)
DTYPES = (torch.float32, torch.bfloat16)
NEG_INF = float("-inf")


def make_mask(batch: int, vocab: int, dense: bool, device: str) -> torch.Tensor:
    words = (vocab + 31) // 32
    g = torch.Generator().manual_seed(batch * 7 + vocab)
    if dense:
        mask = torch.randint(-(2**31), 2**31 - 1, (batch, words), dtype=torch.int32, generator=g)
    else:  # a handful of allowed tokens, as a grammar usually leaves
        mask = torch.zeros((batch, words), dtype=torch.int32)
        mask[:, :4] = torch.tensor([0x10, 0x1, 0x100, 0x3], dtype=torch.int32)
    return mask.to(device)


def count_allowed(bitmask: torch.Tensor, vocab: int) -> int:
    """Set bits of the mask that name tokens below ``vocab`` (row chunks keep temporaries small)."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    total = 0
    for start in range(0, bitmask.shape[0], 256):
        bits = (bitmask[start : start + 256].unsqueeze(-1) >> shifts) & 1
        total += int(bits.view(bits.shape[0], -1)[:, :vocab].sum())
    return total


def torch_apply_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """The plain-torch way: unpack every bit to an int, compare, masked_fill_."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    allowed = bits.view(bitmask.shape[0], -1)[:, : logits.shape[1]] != 0
    logits.masked_fill_(~allowed, NEG_INF)


def torch_sample(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    torch_apply_(logits, bitmask)
    return torch.multinomial(torch.softmax(logits.float(), dim=-1), 1)


def time_cuda(fn: Callable[[], object], budget_s: float = 0.15) -> float:
    """Median microseconds of ``fn`` by CUDA events, after warm-up; repetitions fit the budget."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    reps = int(min(100, max(5, budget_s * 1e3 / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_cpu(fn: Callable[[], object], budget_s: float = 0.5) -> float:
    t = time.perf_counter()
    fn()
    reps = int(min(51, max(5, budget_s / max(time.perf_counter() - t, 1e-6))))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def xgrammar_peers(device: str) -> dict[str, Callable]:
    peers: dict[str, Callable] = {}
    try:
        import xgrammar as xgr
    except ImportError as err:
        print(f"# xgrammar not importable ({err}); no xgrammar columns")
        return peers
    if device == "cpu":
        peers["xgr-cpu"] = lambda lg, bm: xgr.apply_token_bitmask_inplace(lg, bm, backend="cpu")
        return peers
    peers["xgr-triton"] = lambda lg, bm: xgr.apply_token_bitmask_inplace(lg, bm, backend="triton")
    try:  # compiles a CUDA extension with nvcc: absent toolchains just lose the column
        from xgrammar.kernels.apply_token_bitmask_inplace_cuda import (
            apply_token_bitmask_inplace_cuda,
        )

        peers["xgr-cuda"] = lambda lg, bm: apply_token_bitmask_inplace_cuda(lg, bm)
    except Exception as err:  # noqa: BLE001 - any build failure only drops the column
        print(f"# xgrammar CUDA kernel unavailable: {type(err).__name__}: {str(err)[:120]}")
    return peers


def row(cells: list) -> str:
    return " ".join(f"{c:>10}" if not isinstance(c, float) else f"{c:>10.1f}" for c in cells)


def bench_case(args, peers, batch, vocab, dtype, dense) -> list[str]:
    dev = args.device
    gen = torch.Generator(device=dev).manual_seed(0)
    base = torch.randn((batch, vocab), device=dev, generator=gen).to(dtype)
    mask = make_mask(batch, vocab, dense, dev)
    work = base.clone()
    timer = time_cuda if dev == "cuda" else time_cpu
    copy_us = timer(lambda: work.copy_(base))
    bandwidth = 2 * base.numel() * base.element_size() / copy_us  # bytes per microsecond
    disallowed = batch * vocab - count_allowed(mask, vocab)
    mask_bytes = mask.numel() * 4
    floor_apply = (mask_bytes + disallowed * base.element_size()) / bandwidth
    floor_sample = (mask_bytes + base.numel() * base.element_size()) / bandwidth

    ours_fn = apply_bitmask_ if dev == "cuda" else apply_bitmask_torch_
    ours = timer(lambda: ours_fn(work, mask))
    peer_times = {name: timer(lambda fn=fn: fn(work, mask)) for name, fn in peers.items()}
    peer_times["torch"] = timer(lambda: torch_apply_(work, mask))
    best = min(peer_times.values())
    kind = "dense" if dense else "sparse"
    dt = str(dtype).removeprefix("torch.")
    lines = [
        row(
            [
                "apply",
                batch,
                vocab,
                dt,
                kind,
                copy_us,
                ours,
                *peer_times.values(),
                best / ours,
                floor_apply,
                ours / floor_apply,
            ]
        )  # fmt: skip
    ]
    if not args.skip_sample:
        params = SamplingTensors.build([1.0] * batch, seed=list(range(batch)), device=dev)
        ours_s = timer(lambda: sample(work, mask, params))
        torch_s = timer(lambda: torch_sample(work, mask))
        lines.append(
            row(
                [
                    "sample",
                    batch,
                    vocab,
                    dt,
                    kind,
                    copy_us,
                    ours_s,
                    torch_s,
                    torch_s / ours_s,
                    floor_sample,
                    ours_s / floor_sample,
                ]
            )  # fmt: skip
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a reduced grid")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop the grid after this")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    parser.add_argument("--skip-sample", action="store_true")
    args = parser.parse_args()
    print(header(__file__), flush=True)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
        batches, vocabs = (1, 8, 64), (32000, 128256)
    else:
        batches, vocabs = BATCHES, VOCABS
    if args.quick:
        batches, vocabs = batches[:3], vocabs[:2]
    peers = xgrammar_peers(args.device)
    name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {args.threads} thread(s)"
    )
    print(f"# device: {name}; times in microseconds (median); ratio = best peer / ours")
    print("# floor = minimal bytes / copy bandwidth; x-floor = ours / floor")
    print(row(["op", "B", "V", "dtype", "mask", "copy", "ours", *peers, "torch", "ratio",
               "floor", "x-floor"]))  # fmt: skip
    print("# sample rows: columns are copy, ours, torch, ratio (torch/ours), floor, x-floor")
    start = time.monotonic()
    for vocab in vocabs:
        for batch in batches:
            for dtype in DTYPES:
                for dense in (True, False):
                    if time.monotonic() - start > args.budget_s:
                        print(
                            f"# budget of {args.budget_s:.0f}s spent: stopped before B={batch} V={vocab}"
                        )
                        return
                    for line in bench_case(args, peers, batch, vocab, dtype, dense):
                        print(line, flush=True)
    print(f"# grid done in {time.monotonic() - start:.0f}s")


if __name__ == "__main__":
    main()
