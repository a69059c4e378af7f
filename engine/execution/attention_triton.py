"""Paged attention in Triton: the GPU backend behind the `AttentionBackend` seam.

Same contract as `TorchAttention` (engine/execution/attention.py): `prepare` once per forward pass,
`forward` once per layer, which stores the new K/V in the pool at `out_slots` and then lets every
new token attend causally over its sequence's slots. K/V are read straight from the pool through
the slot lists (page size 1); nothing is gathered into a dense copy.

Layout, built on the host by `prepare` and copied to the device once per step:
- `kv_slots`: every sequence's slot ids, concatenated (int32). Sequence `s` owns
  `kv_slots[kv_start[s] : kv_start[s] + kv_len[s]]`; its new tokens are the last `q_len[s]`.
- Decode rows (`q_len == 1`): one `[3, B]` int32 table of (row of q, kv_start, kv_len).
- Extend rows (`q_len > 1`: prefill chunks, drafts): one `[4, S]` int32 table of
  (q_start, q_len, kv_start, kv_len).

Kernels (scores in the log2 domain, `exp2` with the scale folded in; fp32 accumulation; output in
q's dtype):
- `_decode_kernel`, grid (sequence, KV head, split): the `group` query heads sharing a KV head are
  the rows of one `[BLOCK_H, D]` tile, so K/V are read once per KV head (no copy for GQA). Long
  contexts are split into `num_splits` chunks (flash-decoding); each program writes a partial
  (max, sum, unnormalised acc) and `_combine_kernel` merges them with the log-sum-exp trick. With
  one split the decode kernel writes the output itself.
- `_extend_kernel`, grid (query block, head, sequence), one launch for all extending sequences:
  online softmax over KV blocks, row `i` of a sequence seeing slots `j <= kv_len - q_len + i`.

Invariants: every sequence has `1 <= q_len <= kv_len`, so each row sees at least slot 0 of its
list and no softmax row is empty (no NaN); only a decode split past a shorter sequence's end is
empty, and its partial (max -inf, sum 0) weighs nothing in the combine. Positions past a
sequence's end load slot 0 (`PAD_SLOT`, always valid, finite memory) and get zero weight. The pool
dtype equals q's dtype; slot ids fit in int32. `forward` does no host work beyond launching and
never synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from corral.engine.execution.attention import checked_kv_lens
from corral.engine.kvcache.kv_pool import KVPool

_LOG2E = 1.4426950408889634
_SPLIT_ALIGN = 64  # decode splits cover whole multiples of this many slots (of every BLOCK_N)


@triton.jit
def _attend_block(q, acc, m_i, l_i, k, v, visible, qk_scale, PRECISION: tl.constexpr):
    # One online-softmax step over a block of keys; `visible` masks scores to -inf.
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_max_ptr, part_sum_ptr, part_acc_ptr,
    kv_slots_ptr, rows_ptr, kv_start_ptr, kv_len_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,
    qk_scale, split_len, num_splits,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(rows_ptr + seq).to(tl.int64)
    kv_start = tl.load(kv_start_ptr + seq)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, tl.load(kv_len_ptr + seq))
    g = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + g
    live_h = g < GROUP
    d = tl.arange(0, HEAD_DIM)
    q_offs = row * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=live_h[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for base in tl.range(lo, hi, BLOCK_N):
        n = base + tl.arange(0, BLOCK_N)
        live_n = n < hi
        slots = tl.load(kv_slots_ptr + kv_start + n, mask=live_n, other=0).to(tl.int64)
        k = tl.load(k_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + d[None, :])
        v = tl.load(v_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + d[None, :])
        acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, k, v, live_n[None, :], qk_scale, PRECISION)
    if DIRECT:
        out = out_ptr + row * stride_ot + heads[:, None] * HEAD_DIM + d[None, :]
        tl.store(out, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=live_h[:, None])
    else:
        part = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
        tl.store(part_max_ptr + part, m_i, mask=live_h)
        tl.store(part_sum_ptr + part, l_i, mask=live_h)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=live_h[:, None])


@triton.jit
def _combine_kernel(
    out_ptr, part_max_ptr, part_sum_ptr, part_acc_ptr, rows_ptr, stride_ot, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    # One program per (decode sequence, query head): merge the splits' partial softmaxes.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    live = s < num_splits
    part = (seq * tl.num_programs(1) + head) * num_splits + s
    m = tl.load(part_max_ptr + part, mask=live, other=float("-inf"))
    total = tl.load(part_sum_ptr + part, mask=live, other=0.0)
    d = tl.arange(0, HEAD_DIM)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0)
    w = tl.exp2(m - tl.max(m, 0))  # split 0 is never empty, so the max is finite
    o = tl.sum(acc * w[:, None], 0) / tl.sum(total * w, 0)
    row = tl.load(rows_ptr + seq).to(tl.int64)
    tl.store(out_ptr + row * stride_ot + head * HEAD_DIM + d, o.to(out_ptr.dtype.element_ty))


@triton.jit
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, kv_slots_ptr, q_start_ptr, q_len_ptr, kv_start_ptr, kv_len_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, qk_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_len = tl.load(q_len_ptr + seq)
    if block * BLOCK_M >= q_len:  # the grid is sized for the longest extension
        return
    kv_start = tl.load(kv_start_ptr + seq)
    kv_len = tl.load(kv_len_ptr + seq)
    prefix = kv_len - q_len
    kv_head = head // GROUP
    i = block * BLOCK_M + tl.arange(0, BLOCK_M)
    live_m = i < q_len
    rows = (tl.load(q_start_ptr + seq) + i).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=live_m[:, None],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    end = tl.minimum(kv_len, prefix + (block + 1) * BLOCK_M)  # the block's last row sees this far
    for base in tl.range(0, end, BLOCK_N):
        n = base + tl.arange(0, BLOCK_N)
        live_n = n < end
        slots = tl.load(kv_slots_ptr + kv_start + n, mask=live_n, other=0).to(tl.int64)
        k = tl.load(k_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + d[None, :])
        v = tl.load(v_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + d[None, :])
        visible = (n[None, :] <= prefix + i[:, None]) & live_n[None, :]
        acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, k, v, visible, qk_scale, PRECISION)
    out = out_ptr + rows[:, None] * stride_ot + head * HEAD_DIM + d[None, :]
    tl.store(out, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=live_m[:, None])


@dataclass(frozen=True)
class _Tiles:
    """Block sizes for one (head_dim, dtype): the q tile within 32 KB and two pipeline stages of
    K and V tiles within 64 KB of shared memory, so the kernels fit on every recent GPU."""

    DTYPES = (torch.float32, torch.float16, torch.bfloat16)

    block_m: int
    block_n: int
    precision: str  # fp32 operands multiply in full precision, never TF32

    @classmethod
    def fit(cls, head_dim: int, dtype: torch.dtype) -> _Tiles:
        row = head_dim * torch.empty((), dtype=dtype).element_size()  # a power of two
        block_m = max(16, min(64, (32 << 10) // row))
        block_n = max(16, min(64, (64 << 10) // (4 * row)))
        return cls(block_m, block_n, "ieee" if dtype == torch.float32 else "tf32")


@dataclass(frozen=True)
class DecodeRows:
    """Sequences extending by one token; `table` rows are (row of q, kv_start, kv_len), int32.

    Partial buffers (fp32, `[B, H, num_splits(, D)]`) are allocated once per step and reused by
    every layer; they are None when one split suffices.
    """

    table: torch.Tensor  # int32 [3, B] on the device
    num_splits: int
    split_len: int
    partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


@dataclass(frozen=True)
class ExtendRows:
    """Sequences extending by several tokens; `table` rows are (q_start, q_len, kv_start, kv_len)."""

    table: torch.Tensor  # int32 [4, S] on the device
    max_q_len: int


@dataclass(frozen=True)
class TritonMetadata:
    """What `TritonAttention.forward` needs, computed once per forward pass and shared by layers."""

    out_slots: torch.Tensor  # int64 [T]
    num_tokens: int
    kv_slots: torch.Tensor  # int32 [sum of kv_len], every sequence's slots concatenated
    decode: DecodeRows | None
    extend: ExtendRows | None


class TritonAttention:
    """Paged attention with Triton kernels (see the module docstring); same contract as
    `TorchAttention`.

    `split_chunk` is the shortest context worth a split of its own: decode steps whose longest
    context is at most `split_chunk` run in one split, longer ones in up to `max_splits`.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        windows: tuple[int | None, ...] = (),
        *,
        split_chunk: int = 512,
        max_splits: int = 16,
    ) -> None:
        if any(w is not None for w in windows):
            raise ValueError(
                "TritonAttention has no sliding-window masking yet; use TorchAttention for this "
                "model"
            )
        if head_dim < 16 or head_dim & (head_dim - 1):
            raise ValueError(
                f"TritonAttention needs a power-of-two head_dim >= 16, got {head_dim}; "
                "use TorchAttention for this model"
            )
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if split_chunk < 1 or max_splits < 1:
            raise ValueError(f"split_chunk ({split_chunk}) and max_splits ({max_splits}) >= 1")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_heads // num_kv_heads
        self.scale = scale
        self.split_chunk = split_chunk
        self.max_splits = max_splits
        self._tiles = {dt: _Tiles.fit(head_dim, dt) for dt in _Tiles.DTYPES}

    def prepare(
        self,
        out_slots: torch.Tensor,
        seq_kv_indices: list[torch.Tensor],
        extend_lens: list[int],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> TritonMetadata:
        """Build the slot table and per-sequence rows on the host, copy each to `device` once.
        `dtype` is accepted for the protocol; the kernels take it from q."""
        kv_lens = checked_kv_lens(seq_kv_indices, extend_lens)
        decode, extend, q_start, kv_start = [], [], 0, 0
        for q_len, kv_len in zip(extend_lens, kv_lens, strict=True):
            if q_len == 1:
                decode.append((q_start, kv_start, kv_len))
            else:
                extend.append((q_start, q_len, kv_start, kv_len))
            q_start += q_len
            kv_start += kv_len
        flat = torch.cat(seq_kv_indices) if seq_kv_indices else torch.zeros(0, dtype=torch.int64)
        kv_slots = flat.to(torch.int32).to(device, non_blocking=True)
        return TritonMetadata(
            out_slots,
            q_start,
            kv_slots,
            self._decode_rows(decode, device) if decode else None,
            self._extend_rows(extend, device) if extend else None,
        )

    def decode_splits(self, longest: int) -> tuple[int, int]:
        """(num_splits, split_len) of a decode step whose longest context is `longest` (CUDA
        graphs fix them for the longest context allowed)."""
        splits = min(self.max_splits, triton.cdiv(longest, self.split_chunk))
        split_len = triton.cdiv(longest, splits)
        if split_len > _SPLIT_ALIGN:  # whole blocks per split, then drop splits left empty
            split_len = triton.cdiv(split_len, _SPLIT_ALIGN) * _SPLIT_ALIGN
        return triton.cdiv(longest, split_len), split_len

    def _decode_rows(self, rows: list[tuple[int, int, int]], device: torch.device) -> DecodeRows:
        splits, split_len = self.decode_splits(max(kv_len for _, _, kv_len in rows))
        table = torch.tensor(rows, dtype=torch.int32).T.contiguous().to(device, non_blocking=True)
        partials = None
        if splits > 1:
            shape = (len(rows), self.num_heads, splits)
            f32 = dict(dtype=torch.float32, device=device)
            partials = (
                torch.empty(shape, **f32),
                torch.empty(shape, **f32),
                torch.empty((*shape, self.head_dim), **f32),
            )
        return DecodeRows(table, splits, split_len, partials)

    @staticmethod
    def _extend_rows(rows: list[tuple[int, int, int, int]], device: torch.device) -> ExtendRows:
        table = torch.tensor(rows, dtype=torch.int32).T.contiguous().to(device, non_blocking=True)
        return ExtendRows(table, max(q_len for _, q_len, _, _ in rows))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        pool: KVPool,
        meta: TritonMetadata,
    ) -> torch.Tensor:
        k_buf, v_buf = pool.k_buffers[layer], pool.v_buffers[layer]
        tiles = self._tiles.get(q.dtype)
        if tiles is None or k_buf.dtype != q.dtype:
            raise ValueError(
                f"TritonAttention needs q and the KV pool in one of {_Tiles.DTYPES}; got q "
                f"{q.dtype}, pool {k_buf.dtype}"
            )
        k_buf.index_copy_(0, meta.out_slots, k)
        v_buf.index_copy_(0, meta.out_slots, v)
        if q.stride(-1) != 1:
            q = q.contiguous()
        out = torch.empty(
            meta.num_tokens, self.num_heads * self.head_dim, dtype=q.dtype, device=q.device
        )
        strides = (q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1))
        strides += (v_buf.stride(0), v_buf.stride(1), out.stride(0))
        tensors = (q, k_buf, v_buf, out)
        qk_scale = self.scale * _LOG2E
        if meta.decode is not None:
            self._decode(tensors, strides, qk_scale, tiles, meta.kv_slots, meta.decode)
        if meta.extend is not None:
            ext = meta.extend
            grid = (triton.cdiv(ext.max_q_len, tiles.block_m), self.num_heads, ext.table.shape[1])
            _extend_kernel[grid](
                *tensors, meta.kv_slots, *ext.table, *strides, qk_scale,
                GROUP=self.group, HEAD_DIM=self.head_dim, BLOCK_M=tiles.block_m,
                BLOCK_N=tiles.block_n, PRECISION=tiles.precision, num_warps=4, num_stages=2,
            )  # fmt: skip
        return out

    def _decode(self, tensors, strides, qk_scale, tiles, kv_slots, dec: DecodeRows) -> None:
        batch, out = dec.table.shape[1], tensors[3]
        parts = dec.partials if dec.partials is not None else (out, out, out)  # unused if DIRECT
        grid = (batch, self.num_kv_heads, dec.num_splits)
        _decode_kernel[grid](
            *tensors, *parts, kv_slots, *dec.table, *strides, qk_scale, dec.split_len,
            dec.num_splits, GROUP=self.group, HEAD_DIM=self.head_dim,
            BLOCK_H=max(16, triton.next_power_of_2(self.group)), BLOCK_N=tiles.block_n,
            DIRECT=dec.partials is None, PRECISION=tiles.precision, num_warps=4, num_stages=2,
        )  # fmt: skip
        if dec.partials is not None:
            _combine_kernel[(batch, self.num_heads)](
                out, *dec.partials, dec.table[0], out.stride(0), dec.num_splits,
                HEAD_DIM=self.head_dim, BLOCK_S=triton.next_power_of_2(dec.num_splits),
                num_warps=2,
            )  # fmt: skip
