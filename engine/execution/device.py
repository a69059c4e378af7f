"""Where the engine runs and in which dtype: `--device cpu|cuda[:N]`, `--dtype auto|...`.

Checked when the server starts, before any weight is read: a CUDA device that is absent, an index
past the last GPU, or a dtype the device cannot run is a startup error that says what to change.
`auto` is bfloat16 on CUDA (what checkpoints of 1-70B models ship in) and for quantized weights on
the CPU (`--quantize`: the 4-bit kernel's own precision), and float32 for unquantized weights on
the CPU (where the logits match the Hugging Face reference exactly).

On CUDA the KV pool gets what is left of `gpu_memory_fraction` of the device's memory once the
weights are loaded and one forward of `max_batched_tokens` tokens has run (its peak activation
memory), as vLLM's `gpu_memory_utilization`; on the CPU it is `kv_cache_bytes`, as before.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DTYPE_CHOICES = ("auto", *DTYPES)


def parse_device(text: str) -> torch.device:
    """`cpu`, `cuda` or `cuda:N`, checked against this machine."""
    t = str(text).strip().lower()
    try:
        device = torch.device(t)
    except RuntimeError:
        device = None
    if (
        device is None
        or device.type not in ("cpu", "cuda")
        or (device.type == "cpu" and device.index not in (None, 0))
    ):
        raise ValueError(f"device {text!r} is not one of cpu, cuda, cuda:N")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {text!r}: CUDA is not available here (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda or 'none'}); serve with --device cpu"
        )
    count = torch.cuda.device_count()
    index = 0 if device.index is None else device.index
    if index >= count:
        raise ValueError(
            f"device {text!r}: this machine has {count} CUDA device(s), 0..{count - 1}"
        )
    return torch.device("cuda", index)


def parse_dtype(text: str, device: torch.device, quantized: bool = False) -> torch.dtype:
    """The activations' (and dense weights') dtype: `auto` -> bfloat16 on CUDA, and on the CPU
    for quantized weights (the 4-bit kernel computes in bfloat16 anyway, and only bfloat16 inputs
    take its vectorised path), float32 for unquantized weights on the CPU."""
    t = str(text).strip().lower()
    if t not in DTYPE_CHOICES:
        raise ValueError(f"dtype {text!r} is not one of {', '.join(DTYPE_CHOICES)}")
    if t == "auto":
        return torch.bfloat16 if device.type == "cuda" or quantized else torch.float32
    dtype = DTYPES[t]
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{device} has no bfloat16 support; use --dtype float16")
    return dtype


def free_device_bytes(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device, as the driver reports them."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def cuda_kv_budget(
    device: torch.device, fraction: float, activation_peak: int, slot_bytes: int
) -> int:
    """KV bytes on a CUDA device: `fraction` of its memory, minus what this process and others
    already hold (weights, the CUDA context) and the measured activation peak of one forward.

    Raises when nothing is left for even a few slots, naming what took the memory.
    """
    free, total = free_device_bytes(device)
    used_elsewhere = total - free  # weights, context, other processes
    budget = int(total * fraction) - used_elsewhere - activation_peak
    if budget < 2 * slot_bytes:
        gib = 1 << 30
        raise ValueError(
            f"no room for the KV cache on {device}: {fraction:.2f} of {total / gib:.1f} GiB is "
            f"{total * fraction / gib:.1f} GiB, {used_elsewhere / gib:.1f} GiB are in use "
            f"(weights, CUDA context, other processes) and one forward's activations peak at "
            f"{activation_peak / gib:.2f} GiB; raise --gpu-memory-fraction, lower "
            f"max_batched_tokens or serve a smaller model"
        )
    return budget


def profiled_kv_budget(runner, fraction: float, tokens: int) -> int:
    """KV bytes for `runner`'s model on its CUDA device: one forward of `tokens` tokens is run
    on a scratch pool to measure its activation peak, then `cuda_kv_budget`."""
    from corral.engine.execution.batch import ForwardBatch
    from corral.engine.kvcache.kv_pool import KVPool

    device, c = runner.device, runner.config
    probe = runner.make_kv_pool(tokens + 1)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    runner.forward(
        ForwardBatch.from_sequences([[0] * tokens], [torch.arange(1, tokens + 1)]), probe
    )
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del probe
    torch.cuda.empty_cache()
    slot = KVPool.slot_bytes(c.num_layers, c.num_kv_heads, c.head_dim, runner.dtype)
    budget = cuda_kv_budget(device, fraction, peak, slot)
    log.info(
        "KV pool on %s: %.2f GiB (%d tokens); one forward of %d tokens peaks at %.2f GiB",
        device, budget / (1 << 30), budget // slot, tokens, peak / (1 << 30),
    )  # fmt: skip
    return budget
