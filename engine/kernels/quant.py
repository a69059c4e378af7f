"""Matmuls on packed 4-bit weights, converted exactly from GGUF blocks.

torch's CPU weight-only kernel `aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)` computes
`x @ W.T` with, for output row n and input column k in group g = k // group,

    W[n, k] = (q[n, k] - 8) * sz[g, n, 0] + sz[g, n, 1]        q in 0..15

where `packed` comes from `aten._convert_weight_to_int4pack_for_cpu(q int32 [N, K], 1)` (uint8
`[N, K/2]`, a CPU-specific tile layout) and `sz` (`[K/group, N, 2]`) has the activation's dtype.
Every llama.cpp 4-bit block format of group 32 is that formula with some scale and zero:

    Q4_0  d * (q - 8)          scale d,        zero 0
    Q4_1  d * q + m            scale d,        zero m + 8d
    Q4_K  d*sc_j * q - dmin*m_j (sub-block j)  scale d*sc_j,   zero 8*d*sc_j - dmin*m_j
    Q8_0  d * q8               split q8 = 16*hi + lo (hi in -8..7, lo in 0..15) into two
                               4-bit halves laid side by side along K: x is fed as [x, x];
                               hi groups scale 16d zero 0, lo groups scale d zero 8d

In float32 each (q - 8) * scale is exact and each zero is exact for the fp16 block constants, so
the dequantized weights equal gguf's bit for bit (one rounding of the same real number).

Speed (see bench/quant_matmul.py): on x86 only the bfloat16 kernel is vectorised; float32
activations take a scalar loop 10-50x slower than the float32 oneDNN matmul. So the fast path
feeds bfloat16 activations and bfloat16 scales (the fp16 block constants lose 3 mantissa bits)
and returns bfloat16, cast back to the caller's dtype; float32 is the exact, slow reference.

Q6_K and Q5_K have no such mapping (Q6_K's scales cover 16 columns; their 6/5-bit values would
take two or more 4-bit halves each): `KQuantWeight` keeps their values as one unsigned byte each
with the GGUF's own sub-block scales and mins, for the C kernel `cpu_kquant` (exact weights,
activations in two int8 parts as in `cpu_int4`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from corral.engine.kernels.cpu_int4 import int4_kernel
from corral.engine.kernels.cpu_kquant import kquant_kernel

GROUP = 32
"""Block size of every supported GGUF type along K (Q4_K's sub-blocks are 32 too)."""

SUPPORTED_TYPES = (QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q8_0)
KQUANT_TYPES = (QT.Q5_K, QT.Q6_K)  # kept as one byte a value (`KQuantWeight`)
_ROW_ALIGN = 16  # the kernel tiles N by 16/32/64; a row count off that grid is refused
_PACK_CHUNK_ROWS = 1024  # pack this many rows at a time: the int32 staging copies stay small


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """A `[out_features, in_features]` weight packed for `int4_linear`.

    `packed` is opaque (torch's CPU tile layout); `scales_zeros` is `[K'/32, N, 2]` in
    `compute_dtype`, where K' is `in_features` (4-bit types) or twice it (`split_input`: Q8_0,
    whose two 4-bit halves each see the whole input).
    """

    packed: torch.Tensor
    scales_zeros: torch.Tensor
    out_features: int
    in_features: int
    split_input: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.scales_zeros.dtype

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    def linear(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """`x @ self.T + b` (`any_linear` runs a quantized weight through its own `linear`)."""
        return int4_linear(x, self, b)


def int4_linear(x: torch.Tensor, w: Int4Weight, b: torch.Tensor | None) -> torch.Tensor:
    """`x @ W.T + b` for an `Int4Weight`, with the `Linear` signature of `engine.matmul`.

    `x` is `[rows, in_features]` in any float dtype; it is cast to the weight's compute dtype
    and the result back to `x.dtype` (accumulation is float32 inside the kernel either way).
    """
    xc = x.to(w.compute_dtype).contiguous()
    if w.split_input:
        xc = torch.cat((xc, xc), dim=1)
    kernel = int4_kernel() if xc.dtype == torch.bfloat16 else None
    if kernel is not None and kernel.fits(w.packed.shape[0], xc.shape[1]):
        y = kernel.matmul(xc, w.packed, w.scales_zeros)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xc, w.packed, GROUP, w.scales_zeros)
    y = y.to(x.dtype)
    return y if b is None else y.add_(b)


def int4_from_dense(
    w: torch.Tensor, group: int = GROUP, compute_dtype: torch.dtype = torch.bfloat16
) -> Int4Weight:
    """Round a dense `[N, K]` weight to 4 bits at load (`--quantize int4`): per group of `group`
    input columns, 16 evenly spaced levels from the group's minimum to its maximum
    (round to nearest; the error is at most half a level, (max - min) / 30)."""
    n, k = w.shape
    if n % _ROW_ALIGN or k % group:
        raise ValueError(
            f"int4 needs out_features divisible by {_ROW_ALIGN} and in_features by {group}; "
            f"got {tuple(w.shape)}"
        )

    def chunks():
        for start in range(0, n, _PACK_CHUNK_ROWS):
            g = w[start : start + _PACK_CHUNK_ROWS].float().reshape(-1, k // group, group)
            lo, hi = g.amin(dim=2), g.amax(dim=2)
            scale = ((hi - lo) / 15).clamp_min(1e-30)
            q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32)
            yield start, q.reshape(-1, k), scale, lo + 8 * scale  # W = lo + q * scale

    return _packed(n, k, k, chunks(), compute_dtype, split_input=False)


def _packed(
    n: int, k: int, k_stored: int, chunks, compute_dtype: torch.dtype, split_input: bool
) -> Int4Weight:
    """Pack `(first row, q int32 [rows, K'], scale [rows, K'/32], zero [rows, K'/32])` chunks
    into preallocated buffers: peak memory is the result plus one chunk, never two results."""
    packed = torch.empty(n, k_stored // 2, dtype=torch.uint8)
    sz = torch.empty(k_stored // GROUP, n, 2, dtype=compute_dtype)
    for start, q, scale, zero in chunks:
        rows = q.shape[0]
        packed[start : start + rows] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz[:, start : start + rows, 0] = torch.as_tensor(scale).T
        sz[:, start : start + rows, 1] = torch.as_tensor(zero).T
    return Int4Weight(packed, sz, out_features=n, in_features=k, split_input=split_input)


def int4_from_gguf(
    blocks: np.ndarray, qtype: QT, compute_dtype: torch.dtype = torch.bfloat16
) -> Int4Weight:
    """Pack one GGUF tensor's raw blocks (`uint8 [out_features, row_bytes]`, as
    `ReaderTensor.data`) for `int4_linear`.

    Rows are independent: permute or concatenate `blocks` rows before packing (llama.cpp's Q/K
    interleave, fused QKV), never the packed result.
    """
    if qtype not in SUPPORTED_TYPES:
        raise ValueError(
            f"GGUF type {qtype.name} has no int4 mapping; supported: {SUPPORTED_TYPES}"
        )
    values, nbytes = GGML_QUANT_SIZES[qtype]  # per block
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] % nbytes:
        raise ValueError(f"expected uint8 [rows, k*{nbytes}] blocks of {qtype.name}")
    n = blocks.shape[0]
    if n % _ROW_ALIGN:
        raise ValueError(f"int4 kernel needs out_features divisible by {_ROW_ALIGN}, got {n}")
    k = blocks.shape[1] // nbytes * values
    unpack = _UNPACKERS[qtype]

    def chunks():
        for start in range(0, n, _PACK_CHUNK_ROWS):
            q, scale, zero = unpack(blocks[start : start + _PACK_CHUNK_ROWS])
            yield start, torch.from_numpy(q), scale, zero

    split = qtype == QT.Q8_0  # two 4-bit halves side by side along K
    return _packed(n, k, 2 * k if split else k, chunks(), compute_dtype, split_input=split)


# Each unpacker: raw blocks [rows, row_bytes] -> (q int32 [rows, K'] in 0..15,
# scale float32 [rows, K'/32], zero float32 [rows, K'/32]).


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: low nibbles are values 0-15, high ones 16-31."""
    return np.concatenate((qs & 0x0F, qs >> 4), axis=-1).astype(np.int32)


def _unpack_q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 18)
    d = _f16(b[..., 0:2])
    return _nibbles(b[..., 2:]).reshape(rows, -1), d, np.zeros_like(d)


def _unpack_q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 20)
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    return _nibbles(b[..., 4:]).reshape(rows, -1), d, m + 8 * d


def _unpack_q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 144)
    d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
    sc, mn = _q4_k_scale_min(b[..., 4:16])  # [rows, supers, 8] 6-bit each
    # 128 bytes = 4 chunks of 32; sub-block 2j is chunk j's low nibbles, 2j+1 its high ones.
    qs = b[..., 16:].reshape(rows, -1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1)
    q = (qs & 0x0F).astype(np.int32).reshape(rows, -1)
    scale = d * sc.astype(np.float32)
    zero = 8 * scale - dmin * mn.astype(np.float32)
    return q, scale.reshape(rows, -1), zero.reshape(rows, -1)


def _q4_k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # llama.cpp get_scale_min_k4: 8 scales and 8 mins of 6 bits in 12 bytes.
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), axis=-1)
    mn = np.concatenate((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), axis=-1)
    return sc, mn


def _unpack_q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 34)
    d = _f16(b[..., 0:2])
    q8 = b[..., 2:].view(np.int8).astype(np.int32).reshape(rows, -1)
    hi, lo = q8 >> 4, q8 & 0x0F  # q8 == 16 * hi + lo
    q = np.concatenate((hi + 8, lo), axis=1)
    scale = np.concatenate((16 * d, d), axis=1)
    zero = np.concatenate((np.zeros_like(d), 8 * d), axis=1)
    return q, scale, zero


_UNPACKERS = {QT.Q4_0: _unpack_q4_0, QT.Q4_1: _unpack_q4_1, QT.Q4_K: _unpack_q4_k}
_UNPACKERS[QT.Q8_0] = _unpack_q8_0


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """Per-output-channel int8 (`aten._weight_int8pack_mm`): `W[n, k] = q[n, k] * scales[n]`.

    Only a requantization of a GGUF Q8_0 tensor (its scales are per 32-block, the kernel's per
    row): not exact. Kept for comparison; `int4_from_gguf` maps Q8_0 exactly.
    """

    weight: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # [N], compute dtype

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)  # type: ignore[return-value]

    def linear(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return int8_linear(x, self, b)


def int8_linear(x: torch.Tensor, w: Int8Weight, b: torch.Tensor | None) -> torch.Tensor:
    """`x @ W.T + b` for an `Int8Weight` (same dtype handling as `int4_linear`)."""
    xc = x.to(w.scales.dtype).contiguous()
    y = torch.ops.aten._weight_int8pack_mm(xc, w.weight, w.scales).to(x.dtype)
    return y if b is None else y.add_(b)


def int8_requantized(w: torch.Tensor, compute_dtype: torch.dtype = torch.bfloat16) -> Int8Weight:
    """Round a dense `[N, K]` weight to int8 with one symmetric scale per row."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp_min(1e-30) / 127
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(q, scale.to(compute_dtype))


@dataclass(frozen=True, eq=False)
class KQuantWeight:
    """A GGUF Q6_K or Q5_K `[out_features, in_features]` weight for `kquant_linear`:

        W[n, k] = d[s, n] * sc[g, n] * (u[n, k] - offset) - dm[s, n] * mn[g, n]

    over groups g = k // 16 and super-blocks s = k // 256, every product exact in float32, so W
    is gguf's dequantization bit for bit. `u` is one unsigned byte a value (Q6_K: q + 32, offset
    32; Q5_K: q, offset 0), flat in the kernel's layout (per 64 rows and 4 columns, 16-row tiles
    of 4 bytes a row: `csrc/kquant.c`); `sc` int8 and `mn` uint8 `[K/16, N]` (Q5_K's per-32
    scales and mins repeated; Q6_K has no mins: None), `d` and `dm` float32 `[K/256, N]`.
    """

    u: torch.Tensor
    sc: torch.Tensor
    d: torch.Tensor
    mn: torch.Tensor | None
    dm: torch.Tensor | None
    offset: int
    out_features: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def nbytes(self) -> int:
        parts = (self.u, self.sc, self.d, self.mn, self.dm)
        return sum(t.nbytes for t in parts if t is not None)

    def linear(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return kquant_linear(x, self, b)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense `[N, K]` weight (computed in float32, then cast)."""
        n, k = self.shape
        u = self.u.view(n // _KQ_BLOCK_N, k // 4, _KQ_BLOCK_N, 4).permute(0, 2, 1, 3)
        q = u.reshape(n, k).float() - self.offset
        scale = self.d.repeat_interleave(_KQ_SUPER // _KQ_GROUP, 0) * self.sc.float()
        w = q * scale.T.repeat_interleave(_KQ_GROUP, 1)
        if self.mn is not None:
            mins = self.dm.repeat_interleave(_KQ_SUPER // _KQ_GROUP, 0) * self.mn.float()
            w -= mins.T.repeat_interleave(_KQ_GROUP, 1)
        return w.to(dtype)


_KQ_BLOCK_N, _KQ_GROUP, _KQ_SUPER = 64, 16, 256


def kquant_linear(x: torch.Tensor, w: KQuantWeight, b: torch.Tensor | None) -> torch.Tensor:
    """`x @ W.T + b` for a `KQuantWeight`: the C kernel on bfloat16 activations (result cast
    back to `x.dtype`); where the kernel cannot run, the dequantized weight (slow: the loader
    keeps such tensors dense there instead)."""
    kernel = kquant_kernel()
    if kernel is None:
        y = x @ w.dequantized(x.dtype).T
    else:
        y = kernel.matmul(x.to(torch.bfloat16).contiguous(), w).to(x.dtype)
    return y if b is None else y.add_(b)


def kquant_fits(n: int, k: int) -> bool:
    """Whether a `[n, k]` weight tiles the kquant kernel's grid."""
    return n % _KQ_BLOCK_N == 0 and k % _KQ_SUPER == 0 and n > 0


def kquant_from_gguf(blocks: np.ndarray, qtype: QT) -> KQuantWeight:
    """A GGUF Q6_K or Q5_K tensor's raw blocks (`uint8 [out_features, row_bytes]`) as a
    `KQuantWeight`. Rows are independent: permute or concatenate block rows before, as for
    `int4_from_gguf`."""
    if qtype not in KQUANT_TYPES:
        raise ValueError(f"GGUF type {qtype.name} is not one of {KQUANT_TYPES}")
    values, nbytes = GGML_QUANT_SIZES[qtype]
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] % nbytes:
        raise ValueError(f"expected uint8 [rows, k*{nbytes}] blocks of {qtype.name}")
    n, k = blocks.shape[0], blocks.shape[1] // nbytes * values
    if not kquant_fits(n, k):
        raise ValueError(f"the kquant kernel needs out_features % 64 == 0, got {n}")
    has_min = qtype == QT.Q5_K
    u = torch.empty(n * k, dtype=torch.uint8)
    sc = torch.empty(k // _KQ_GROUP, n, dtype=torch.int8)
    d = torch.empty(k // _KQ_SUPER, n, dtype=torch.float32)
    mn = torch.empty_like(sc, dtype=torch.uint8) if has_min else None
    dm = torch.empty_like(d) if has_min else None
    unpack = _unpack_q6_k if qtype == QT.Q6_K else _unpack_q5_k
    for start in range(0, n, _PACK_CHUNK_ROWS):
        part = unpack(blocks[start : start + _PACK_CHUNK_ROWS])
        rows = part[0].shape[0]
        tiles = part[0].reshape(rows // _KQ_BLOCK_N, _KQ_BLOCK_N, k // 4, 4).transpose(0, 2, 1, 3)
        u[start * k : (start + rows) * k] = torch.from_numpy(np.ascontiguousarray(tiles).ravel())
        sc[:, start : start + rows] = torch.from_numpy(part[1].T)
        d[:, start : start + rows] = torch.from_numpy(part[2].T)
        if has_min:
            mn[:, start : start + rows] = torch.from_numpy(part[3].T)
            dm[:, start : start + rows] = torch.from_numpy(part[4].T)
    offset = 32 if qtype == QT.Q6_K else 0
    return KQuantWeight(u, sc, d, mn, dm, offset, out_features=n, in_features=k)


# Each kquant unpacker: raw blocks [rows, row_bytes] -> (u uint8 [rows, K], sc int8 [rows, K/16],
# d float32 [rows, K/256], and for Q5_K mn uint8 [rows, K/16], dm float32 [rows, K/256]).


def _unpack_q6_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    # 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales, fp16 d. Value
    # 128h + 64i + 32j + l takes nibble i of ql[64h + 32j + l] and bits 2(2i + j) of qh[32h + l].
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 210)
    ql = b[..., :128].reshape(rows, -1, 2, 1, 2, 32)
    low = (ql >> np.array([0, 4], np.uint8).reshape(2, 1, 1)) & 0x0F
    qh = b[..., 128:192].reshape(rows, -1, 2, 1, 1, 32)
    high = (qh >> np.array([[0, 2], [4, 6]], np.uint8).reshape(2, 2, 1)) & 0x03
    u = (low | (high << 4)).reshape(rows, -1)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(rows, -1)
    return u, sc, _f16(b[..., 208:210])


def _unpack_q5_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    # 176 bytes: fp16 d and dmin, 12 bytes of 6-bit scales/mins (as Q4_K), qh[32], qs[128].
    # Value 64j + 32i + l takes nibble i of qs[32j + l] and bit 2j + i of qh[l].
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 176)
    qs = b[..., 48:].reshape(rows, -1, 4, 1, 32)
    low = (qs >> np.array([0, 4], np.uint8).reshape(2, 1)) & 0x0F
    qh = b[..., 16:48].reshape(rows, -1, 1, 1, 32)
    high = (qh >> np.arange(8, dtype=np.uint8).reshape(4, 2, 1)) & 0x01
    u = (low | (high << 4)).reshape(rows, -1)
    sc, mn = _q4_k_scale_min(b[..., 4:16])  # [rows, supers, 8], one per 32 values
    sc = np.repeat(sc.reshape(rows, -1), 2, axis=1).astype(np.int8)
    mn = np.repeat(mn.reshape(rows, -1), 2, axis=1).astype(np.uint8)
    return u, sc, _f16(b[..., 0:2]), mn, _f16(b[..., 2:4])


@dataclass(frozen=True, eq=False)
class RowStack:
    """A fused matmul weight (Q/K/V, gate/up) whose parts are quantized in different types, as
    in every Q4_K_M file (Q and K in Q4_K, V in Q6_K): each part runs its own kernel and the
    outputs are laid side by side, which is what the fused weight's matmul gives."""

    parts: tuple[Int4Weight | KQuantWeight, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def linear(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = torch.cat([p.linear(x, None) for p in self.parts], dim=-1)
        return y if b is None else y.add_(b)


MatmulWeight: TypeAlias = "torch.Tensor | Int4Weight | Int8Weight | KQuantWeight | RowStack"
"""What a model's matmul weight may be: dense (plain or oneDNN-packed) or quantized."""


def any_linear(dense: Callable) -> Callable:
    """A `Linear` that runs dense weights (tensors) through `dense` and quantized ones through
    their own kernel, their `linear(x, b)` (`Int4Weight`, `Int8Weight`,
    `gguf_weights.RefinedHead`): a model may mix them (a GGUF tensor type without a mapping
    stays dense). Each weight type says how it runs; nothing is registered in a global."""
    if getattr(dense, "handles_quantized", False):
        return dense

    def linear(x: torch.Tensor, w, b: torch.Tensor | None) -> torch.Tensor:
        return dense(x, w, b) if isinstance(w, torch.Tensor) else w.linear(x, b)

    linear.handles_quantized = True  # type: ignore[attr-defined]
    return linear


def quantize_model(model, kind: str) -> None:
    """Quantize every dense matmul weight of a `DecoderModel` in place (`--quantize int4|int8`):
    the layers' four and the LM head; the embedding stays dense for the token lookup. A weight
    whose shape the int4 kernel cannot tile stays dense."""

    def convert(w: torch.Tensor) -> MatmulWeight:
        if kind == "int8":
            return int8_requantized(w)
        n, k = w.shape
        return int4_from_dense(w) if n % _ROW_ALIGN == 0 and k % GROUP == 0 else w

    with torch.no_grad():
        for layer in model.layers:
            for name in layer.MATMUL_WEIGHTS:
                layer.set_matmul_weight(name, convert(getattr(layer, name)))
        model.set_lm_head(convert(model.lm_head))
