"""Fused plain-C kernels for the bfloat16 CPU decode step, built at first use and called by ctypes.

A quantized CPU decode step of a small model spends more time in ~20 small torch ops per layer
(norms, RoPE, the K/V scatter and gather, SDPA on a few query rows, silu * up, casts) than in its
int4 matmuls. `csrc/decode.c` does each of those in one pass over bfloat16 data with float32
math: RMSNorm (alone, or fused with the residual add before it), RoPE in place, silu(gate) * up,
and paged decode attention that reads each sequence's K/V straight from the pool (no gather copy)
and stores the step's new K/V itself.

The source has no torch headers, so the system compiler builds it in about a second, into
`<cache>/kernels/` (`corral.base.paths.cache_root`), keyed by a hash of the source, the compiler, its
flags and the CPU (the build uses `-march=native`), written to a temp file and renamed into
place. `$CC` names the compiler (default `cc`). Without a compiler, or if the build fails, one
line is logged and the model keeps its torch ops; `CORRAL_CPU_KERNELS=0` turns the kernels off.

A wrong pointer is a crash, not an exception, so every wrapper checks dtype, device, shape and
strides before the call, and the attention kernel checks every row and slot index it is given.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from corral.base.paths import cache_root

if TYPE_CHECKING:
    from corral.engine.execution.attention import DecodeGroup

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "decode.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC")
SWITCH_ENV = "CORRAL_CPU_KERNELS"  # "0" keeps the torch ops
COMPILER_ENV = "CC"
HEAD_DIM_MULTIPLE = 16  # the attention kernel's vector width (VW in decode.c)
_BUILD_TIMEOUT_S = 120

_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    "corral_rms_norm": (_P, _P, _P, _I64, _I64, _F),
    "corral_add_rms_norm": (_P, _P, _P, _P, _I64, _I64, _F),
    "corral_rope": (_P, _I64, _P, _P, _I64, _I64, _I64),
    "corral_silu_mul": (_P, _P, _I64, _I64),
    "corral_decode_attention": (
        (_P, _I64, _I64, _P, _I64, _P, _I64, _P, _P, _I64, _P, _P, _P, _I64, _I64, _I64, _I64)
        + (_I64,)
        + (_F, _P, _P, _INT)
    ),
}


class KernelError(RuntimeError):
    """A kernel refused its arguments (an index out of range): a bug in the engine."""


def _cpu_fingerprint() -> str:
    """The CPU's feature flags: a `-march=native` build must not run on another CPU model."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def build(source: Path = SOURCE, cc: str | None = None, folder: Path | None = None) -> Path:
    """Compile `source` into a shared library in `folder` (unless already there); its path.

    Raises `OSError` (no compiler), `subprocess.CalledProcessError` or `TimeoutExpired`.
    """
    cc = cc or os.environ.get(COMPILER_ENV) or "cc"
    folder = folder or cache_root() / "kernels"
    # the source and the files beside it that it may include (`decode.c` includes `int4.c`)
    text = b"\0".join(f.read_bytes() for f in [source, *sorted(source.parent.glob("*.[ch]"))])
    key = hashlib.sha256(b"\0".join([text, cc.encode(), " ".join(FLAGS).encode(),
                                      _cpu_fingerprint().encode()])).hexdigest()[:16]  # fmt: skip
    target = folder / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{source.stem}-", suffix=".so")
    os.close(fd)
    try:
        cmd = [cc, *FLAGS, "-o", tmp, str(source), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=_BUILD_TIMEOUT_S)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def library() -> CpuKernels | None:
    """The kernels of this process, built (or found) on first use; None if they cannot be built."""
    try:
        return CpuKernels(ctypes.CDLL(str(build())))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        log.warning(
            "CPU decode kernels unavailable, keeping the torch ops: %s %s",
            e,
            detail.decode(errors="replace").strip().splitlines()[:1],
        )
        return None


def kernels_for(dtype: torch.dtype, device: torch.device) -> CpuKernels | None:
    """The kernels where they apply (bfloat16 on the CPU, not switched off), else None."""
    if dtype != torch.bfloat16 or device.type != "cpu" or os.environ.get(SWITCH_ENV) == "0":
        return None
    return library()


def _bf16(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.bfloat16 or t.device.type != "cpu":
        raise ValueError(f"{name}: needs a bfloat16 CPU tensor, got {t.dtype} on {t.device}")


def _dense(t: torch.Tensor, name: str, shape: tuple[int, ...]) -> int:
    """Check a contiguous bfloat16 CPU tensor of `shape`; its data pointer."""
    _bf16(t, name)
    if tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(f"{name}: needs a contiguous {shape}, got {tuple(t.shape)} {t.stride()}")
    return t.data_ptr()


def _rows(t: torch.Tensor, name: str, heads: int, d: int) -> tuple[int, int]:
    """Check a `[rows, heads, d]` bfloat16 view whose rows are dense `heads * d` runs at any row
    stride inside its storage; (data pointer, row stride in elements)."""
    _bf16(t, name)
    if t.dim() != 3 or tuple(t.shape[1:]) != (heads, d) or t.stride()[1:] != (d, 1):
        raise ValueError(f"{name}: needs [rows, {heads}, {d}] rows, got {tuple(t.shape)}")
    stride, n = t.stride(0), t.shape[0]  # (a single row's stride means nothing)
    end = t.storage_offset() + (n - 1) * stride + heads * d
    if (n > 1 and stride < heads * d) or end * 2 > t.untyped_storage().nbytes():
        raise ValueError(f"{name}: rows overlap or leave their storage (stride {stride})")
    return t.data_ptr(), stride


def _index(t: torch.Tensor, name: str, n: int) -> int:
    if t.dtype != torch.int64 or t.device.type != "cpu" or t.numel() != n or not t.is_contiguous():
        raise ValueError(f"{name}: needs {n} contiguous int64 CPU indices")
    return t.data_ptr()


class CpuKernels:
    """The loaded library; each method checks its tensors, then makes one C call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int if "attention" in name else None
        self._lib = lib
        self._norm, self._add_norm = lib.corral_rms_norm, lib.corral_add_rms_norm
        self._rope, self._silu_mul = lib.corral_rope, lib.corral_silu_mul
        self._attention = lib.corral_decode_attention
        self.decode_layer_fn = lib.corral_decode_layer  # typed by `engine.fused_decode`

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of `[rows, n]` over its last axis (as `F.rms_norm`), into a new tensor."""
        rows, n = x.shape
        out = torch.empty_like(x)
        xp, wp = _dense(x, "x", (rows, n)), _dense(weight, "weight", (n,))
        self._norm(xp, wp, out.data_ptr(), rows, n, eps)
        return out

    def add_rms_norm_(
        self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """`y += x` in place (the residual stream), then return RMSNorm of the new `y`."""
        rows, n = y.shape
        out = torch.empty_like(y)
        xp, yp = _dense(x, "x", (rows, n)), _dense(y, "y", (rows, n))
        self._add_norm(xp, yp, _dense(weight, "weight", (n,)), out.data_ptr(), rows, n, eps)
        return out

    def rope_(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE in place on `[T, heads, head_dim]` rows (any row stride), with the
        `[T, 1, head_dim]` tables of `model.rope_cos_sin`; returns `x`."""
        t, heads, d = x.shape
        if d % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {d}")
        xp, stride = _rows(x, "x", heads, d)
        cp, sp = _dense(cos, "cos", (t, 1, d)), _dense(signed_sin, "sin", (t, 1, d))
        self._rope(xp, stride, cp, sp, t, heads, d)
        return x

    def silu_mul(self, h: torch.Tensor) -> torch.Tensor:
        """`silu(gate) * up` for `h = [gate | up]` of shape `[rows, 2n]`; `[rows, n]`."""
        rows, n2 = h.shape
        out = torch.empty(rows, n2 // 2, dtype=h.dtype)
        self._silu_mul(_dense(h, "h", (rows, n2 - n2 % 2)), out.data_ptr(), rows, n2 // 2)
        return out

    def decode_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        group: DecodeGroup,
        scale: float,
        out_slots: torch.Tensor | None,
    ) -> torch.Tensor:
        """The decode group's attention, `[B, heads * head_dim]` in group order.

        `q` `[T, heads, d]` and `k`/`v` `[T, kv_heads, d]` are the step's rows (views into the
        QKV projection are fine); the pool buffers are `[slots, kv_heads, d]`. With `out_slots`
        (`[T]`, as `index_copy_` takes it), the group's new K/V are stored there first.
        """
        t, heads, d = q.shape
        slots, hkv, _ = k_buf.shape
        b, length = group.batch, group.length
        if heads % hkv:
            raise ValueError(f"{heads} query heads do not group over {hkv} KV heads")
        qp, q_stride = _rows(q, "q", heads, d)
        kp, k_stride = _rows(k, "k", hkv, d)
        vp, v_stride = _rows(v, "v", hkv, d)
        if k.shape[0] != t or v.shape[0] != t:
            raise ValueError(f"q, k and v need the same rows: {q.shape}, {k.shape}, {v.shape}")
        kb, vb = _dense(k_buf, "k_buf", (slots, hkv, d)), _dense(v_buf, "v_buf", (slots, hkv, d))
        out = torch.empty(b, heads * d, dtype=q.dtype)
        status = self._attention(
            qp, q_stride, t, kp, k_stride, vp, v_stride, kb, vb, slots,
            _index(group.row_ids, "rows", b), _index(group.kv, "kv", b * length),
            _index(group.lens, "lens", b), b, length, hkv, heads // hkv, d,
            scale, None if out_slots is None else _index(out_slots, "out_slots", t),
            out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise KernelError(f"decode attention refused its batch (status {status})")
        return out
