"""The 4-bit weight matmul of the CPU decode path, as a C kernel (`csrc/int4.c`).

torch's `_weight_int4pack_mm_for_cpu` turns each 4-bit weight into a float and multiply-adds it
with a bfloat16 activation, 16 at a time. `csrc/int4.c` reads the same packed weights in place
and quantizes the activations per group of 32 to int8 instead, as llama.cpp does for its 4-bit
dot products, so that one AVX-512 VNNI instruction does 64 multiply-adds: a batch-1 decode step
of the default model spends a third of the time in its matmuls that it did (`bench/cpu_decode.py`).
The int8 rounding of the activations adds an error of the size bfloat16 activations already
have; `tests/engine/test_engine_quant.py` bounds the logits' KL divergence and top-1 agreement
against the float32 reference with the kernel on.

Built with the other CPU kernels (`cpu_kernels.build`: `-march=native`, cached by source, compiler
and CPU) where the CPU has AVX512-VNNI and AVX512-VBMI; elsewhere, with `CORRAL_CPU_KERNELS=0`, or
for shapes off its grid (in_features a multiple of 32, out_features of 64), `int4_linear` keeps
torch's kernel.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
from pathlib import Path

import torch

from corral.engine.kernels.cpu_kernels import SWITCH_ENV, KernelError, build

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "int4.c"
BLOCK_N, GROUP = 64, 32
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


class Int4Kernel:
    """The loaded `csrc/int4.c`: `matmul` checks its tensors, then makes one C call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._matmul = lib.corral_int4_matmul
        self._matmul.argtypes = (_P, _I64, _I64, _P, _P, _I64, _P, _INT)
        self._matmul.restype = ctypes.c_int

    @staticmethod
    def fits(n: int, k: int) -> bool:
        return n % BLOCK_N == 0 and k % GROUP == 0 and n >= BLOCK_N and k >= GROUP

    def matmul(
        self, x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor
    ) -> torch.Tensor:
        """`x [m, k]` (contiguous bfloat16) times the packed `[n, k]` weight: `[m, n]` bfloat16."""
        m, k = x.shape
        n = packed.shape[0]
        if x.dtype != torch.bfloat16 or not x.is_contiguous() or not self.fits(n, k):
            raise ValueError(f"int4 kernel: needs contiguous bfloat16 [m, {k}], got {x.dtype}")
        if (
            packed.dtype != torch.uint8
            or tuple(packed.shape) != (n, k // 2)
            or not packed.is_contiguous()
            or scales_zeros.dtype != torch.bfloat16
            or tuple(scales_zeros.shape) != (k // GROUP, n, 2)
            or not scales_zeros.is_contiguous()
        ):
            raise ValueError("int4 kernel: the packed weight or its scales are not as packed")
        out = torch.empty(m, n, dtype=torch.bfloat16)
        if m == 0:
            return out
        status = self._matmul(
            x.data_ptr(), m, k, packed.data_ptr(), scales_zeros.data_ptr(), n, out.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise KernelError(f"int4 kernel refused [{m}, {k}] x [{n}, {k}] (status {status})")
        return out


@functools.cache
def library() -> Int4Kernel | None:
    """The kernel of this process, built (or found) on first use; None where it cannot run."""
    try:
        lib = ctypes.CDLL(str(build(SOURCE)))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("CPU int4 kernel unavailable, keeping torch's: %s", e)
        return None
    lib.corral_int4_available.restype = ctypes.c_int
    if not lib.corral_int4_available():
        log.info("CPU int4 kernel needs AVX512-VNNI and AVX512-VBMI; keeping torch's")
        return None
    return Int4Kernel(lib)


def int4_kernel() -> Int4Kernel | None:
    """The kernel where it applies (not switched off, built for this CPU), else None."""
    if os.environ.get(SWITCH_ENV) == "0":
        return None
    return library()
