"""The 8-bit weight matmul that keeps GGUF's Q6_K and Q5_K tensors quantized on the CPU, as a C
kernel (`csrc/kquant.c`).

torch has no CPU kernel for weights with a scale per 16 columns (Q6_K's sub-blocks), and the int4
kernel's 32-column groups cannot hold them, so these tensors used to be dequantized to bfloat16.
`csrc/kquant.c` reads one unsigned byte per weight with the GGUF's own sub-block scales and mins
(`quant.KQuantWeight`: 8.6 bits a weight for Q6_K, 9.3 for Q5_K, against bfloat16's 16), and
quantizes the activations per group of 16 into two int8 parts (about 15 bits, as `csrc/int4.c`
does) so that AVX-512 VNNI does the multiply-adds.

Built with the other CPU kernels (`cpu_kernels.build`) where the CPU has AVX512-VNNI; elsewhere,
or with `CORRAL_CPU_KERNELS=0`, the loader keeps such tensors dense as before
(`gguf_weights._matmul`).
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

SOURCE = Path(__file__).with_name("csrc") / "kquant.c"
BLOCK_N, SUPER = 64, 256
_P, _I64, _I32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int


class KQuantKernel:
    """The loaded `csrc/kquant.c`: `matmul` checks its tensors, then makes one C call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._matmul = lib.corral_kquant_matmul
        self._matmul.argtypes = (_P, _I64, _I64, _P, _P, _P, _P, _P, _I32, _I64, _P, _INT)
        self._matmul.restype = ctypes.c_int

    @staticmethod
    def fits(n: int, k: int) -> bool:
        return n % BLOCK_N == 0 and k % SUPER == 0 and n >= BLOCK_N and k >= SUPER

    def matmul(self, x: torch.Tensor, w) -> torch.Tensor:
        """`x [m, k]` (contiguous bfloat16) times `w` (a `quant.KQuantWeight` `[n, k]`):
        `[m, n]` bfloat16."""
        m, k = x.shape
        n = w.out_features
        if x.dtype != torch.bfloat16 or not x.is_contiguous() or k != w.in_features:
            raise ValueError(f"kquant kernel: needs contiguous bfloat16 [m, {w.in_features}]")
        if not self.fits(n, k):
            raise ValueError(f"kquant kernel: [{n}, {k}] is off the kernel's grid")
        _check(w.u, torch.uint8, (n * k,))
        _check(w.sc, torch.int8, (k // 16, n))
        _check(w.d, torch.float32, (k // SUPER, n))
        if w.mn is not None:
            _check(w.mn, torch.uint8, (k // 16, n))
            _check(w.dm, torch.float32, (k // SUPER, n))
        out = torch.empty(m, n, dtype=torch.bfloat16)
        if m == 0:
            return out
        mn, dm = (w.mn.data_ptr(), w.dm.data_ptr()) if w.mn is not None else (None, None)
        status = self._matmul(
            x.data_ptr(), m, k, w.u.data_ptr(), w.sc.data_ptr(), mn, w.d.data_ptr(), dm,
            w.offset, n, out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise KernelError(f"kquant kernel refused [{m}, {k}] x [{n}, {k}] (status {status})")
        return out


def _check(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.is_cuda:
        raise ValueError(f"kquant kernel: expected contiguous {dtype} {shape}, got {t.dtype} "
                         f"{tuple(t.shape)}")  # fmt: skip


@functools.cache
def library() -> KQuantKernel | None:
    """The kernel of this process, built (or found) on first use; None where it cannot run."""
    try:
        lib = ctypes.CDLL(str(build(SOURCE)))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("CPU Q6_K/Q5_K kernel unavailable, keeping such tensors dense: %s", e)
        return None
    lib.corral_kquant_available.restype = ctypes.c_int
    if not lib.corral_kquant_available():
        log.info("CPU Q6_K/Q5_K kernel needs AVX512-VNNI; keeping such tensors dense")
        return None
    return KQuantKernel(lib)


def kquant_kernel() -> KQuantKernel | None:
    """The kernel where it applies (not switched off, built for this CPU), else None."""
    if os.environ.get(SWITCH_ENV) == "0":
        return None
    return library()
