"""Attention over the paged KV pool: the seam where a GPU kernel slots in later.

A backend has two steps. `prepare` runs once per forward pass and turns the ragged batch layout
(which slots each sequence attends over) into whatever the kernel wants; `forward` runs once per
layer. It stores the new tokens' K/V in the pool, then lets every new token attend over its
sequence's slots, causally. A Triton paged-attention backend (or one that replays CUDA graphs)
implements the same two methods, so neither the model nor the scheduler changes.

Grouped-query attention without copying K/V per query head: the `group` query heads that share
one KV head are stacked as extra query rows of that KV head, so attention runs at KV-head
granularity and the causal mask is tiled `group` times.

Decoding rows (one new token per sequence) all go through one padded SDPA call per layer, whatever
else is in the batch; the padded slot list and its additive mask are built once per step in
`prepare`. Only sequences that extend by several tokens (prefill chunks, drafts) attend one by one.
K/V are gathered with `index_select` on a flat index, several times faster than advanced indexing.

Sliding windows (Gemma 3's local layers): a layer with window `W` lets the token at position `i`
attend to positions `i - W + 1 .. i` only. `prepare` builds, for each distinct window that cuts
something off in this batch, the windowed version of each mask (decode group: additive, padding
included; spans: boolean, also for fresh spans, which then go through the gathered path); a layer
picks its window's masks in `forward`. Where no sequence of the batch is longer than a window, that
window changes nothing and the layer runs exactly as a global one.

For bfloat16 on the CPU (the quantized path) the decode group skips all of that: one C kernel
(`cpu_kernels`) reads each sequence's K/V straight from the pool and, on a decode-only step, stores
the step's new K/V itself. SDPA on a few query rows is slow on the CPU, the gather is a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from corral.engine.kernels.cpu_kernels import HEAD_DIM_MULTIPLE, CpuKernels, kernels_for
from corral.engine.kvcache.kv_pool import PAD_SLOT, KVPool


@dataclass(frozen=True)
class SeqSpan:
    """One sequence of a ragged batch: rows `q_start:q_start+q_len` attend over `kv_indices`.

    Invariant: the new tokens are the last `q_len` entries of `kv_indices`, so token `i` of the
    extension sees the first `len(kv_indices) - q_len + i + 1` slots.
    """

    q_start: int
    q_len: int
    kv_indices: torch.Tensor  # int64 [kv_len] on the model device
    mask: torch.Tensor | None  # bool [group * q_len, kv_len]; None when no masking is needed
    fresh: bool = False  # no cached prefix: attend over the new K/V directly, plain causal
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)  # by sliding window


@dataclass(frozen=True)
class DecodeGroup:
    """The batch's single-token rows, attended in one padded call.

    Row `i` of the group (batch row `rows[i]`) attends over `kv[i * length : (i + 1) * length]`;
    entries past the sequence's own length point at `PAD_SLOT` and `mask` hides them (its K/V are
    always finite, zeros or a padding token's, so a zero weight on them stays zero).
    """

    rows: slice | torch.Tensor  # a slice when the rows are contiguous, else int64 [B]
    kv: torch.Tensor  # int64 [B * length], flat for `index_select`
    batch: int
    length: int
    mask: torch.Tensor | None  # additive [B, 1, 1, length] in the model dtype; None if no padding
    row_ids: torch.Tensor  # int64 [B]: `rows` as indices (the C kernel's form)
    lens: torch.Tensor  # int64 [B]: each row's own KV length
    kernels: CpuKernels | None = None  # attend with the C kernel (bfloat16 on the CPU)
    # By sliding window: additive [B, 1, 1, length] masks hiding padding and what lies before
    # the window (such layers attend through SDPA, not the C kernel).
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class AttentionMetadata:
    """What `TorchAttention.forward` needs, computed once per forward pass and shared by layers."""

    out_slots: torch.Tensor  # int64 [T]
    spans: tuple[SeqSpan, ...]  # sequences extending by more than one token
    decode: DecodeGroup | None = None  # sequences extending by exactly one token


class AttentionBackend(Protocol):
    """The contract the model relies on (see module docstring)."""

    def prepare(
        self,
        out_slots: torch.Tensor,
        seq_kv_indices: list[torch.Tensor],
        extend_lens: list[int],
        device: torch.device,
        dtype: torch.dtype,
    ) -> AttentionMetadata: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        pool: KVPool,
        meta: AttentionMetadata,
    ) -> torch.Tensor: ...


def checked_kv_lens(seq_kv_indices: list[torch.Tensor], extend_lens: list[int]) -> list[int]:
    """Each sequence's KV length, after checking `1 <= extend_len <= kv_len` for every one (the
    invariant every backend's kernels rely on)."""
    kv_lens = [int(ix.numel()) for ix in seq_kv_indices]
    for q_len, kv_len in zip(extend_lens, kv_lens, strict=True):
        if not 0 < q_len <= kv_len:
            raise ValueError(
                f"each sequence needs 1 <= extend_len <= len(seq_kv_indices); got "
                f"extend_len={q_len}, kv_len={kv_len}"
            )
    return kv_lens


class TorchAttention:
    """Portable backend: gathers each sequence's K/V from the pool and calls torch SDPA.

    `q` is `[T, num_heads, head_dim]`, `k`/`v` are `[T, num_kv_heads, head_dim]` (already rotated);
    the result is `[T, num_heads * head_dim]` in the same row order.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        windows: tuple[int | None, ...] = (),
    ) -> None:
        """`windows`: each layer's sliding window (None: global); empty: every layer global."""
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_heads // num_kv_heads
        self.scale = scale
        self.windows = tuple(windows)
        self._window_set = sorted({w for w in self.windows if w is not None})

    def prepare(
        self,
        out_slots: torch.Tensor,
        seq_kv_indices: list[torch.Tensor],
        extend_lens: list[int],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> AttentionMetadata:
        """Sort the sequences into the decode group and extend spans; `dtype` is the model's
        activation dtype, in which the decode group's additive mask is built."""
        kv_lens = checked_kv_lens(seq_kv_indices, extend_lens)
        spans, decode_rows, decode_kv, start = [], [], [], 0
        for kv, q_len, kv_len in zip(seq_kv_indices, extend_lens, kv_lens, strict=True):
            if q_len == 1:
                decode_rows.append(start)
                decode_kv.append(kv)
            else:
                spans.append(self._span(kv, start, q_len, kv_len, device))
            start += q_len
        decode = None
        if decode_kv:
            kernels = kernels_for(dtype, device) if self.head_dim % HEAD_DIM_MULTIPLE == 0 else None
            decode = self._decode_group(decode_rows, decode_kv, device, dtype, kernels)
        return AttentionMetadata(out_slots, tuple(spans), decode)

    def _span(
        self, kv: torch.Tensor, start: int, q_len: int, kv_len: int, device: torch.device
    ) -> SeqSpan:
        mask, fresh = None, q_len == kv_len
        rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        cols = torch.arange(kv_len, device=device)[None, :]
        if not fresh:
            mask = (cols <= rows).repeat(self.group, 1)
        windowed = {
            w: ((cols <= rows) & (cols > rows - w)).repeat(self.group, 1)
            for w in self._window_set
            if w < kv_len
        }
        kv = kv.to(device=device, dtype=torch.int64, non_blocking=True)
        return SeqSpan(start, q_len, kv, mask, fresh, windowed)

    def _decode_group(
        self,
        rows: list[int],
        kvs: list[torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        kernels: CpuKernels | None,
    ) -> DecodeGroup:
        lens = [int(ix.numel()) for ix in kvs]
        b, length = len(kvs), max(lens)
        padded = torch.nn.utils.rnn.pad_sequence(
            [ix.to(torch.int64) for ix in kvs], batch_first=True, padding_value=PAD_SLOT
        )
        cols, lens_col = torch.arange(length)[None, :], torch.tensor(lens)[:, None]

        def additive(valid: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(b, 1, 1, length, dtype=dtype)
            mask.masked_fill_(~valid.view(b, 1, 1, length), float("-inf"))
            return mask.to(device, non_blocking=True)

        mask = None
        if min(lens) != length and kernels is None:  # the kernel reads each row's own length
            mask = additive(cols < lens_col)
        windowed = {
            w: additive((cols < lens_col) & (cols >= lens_col - w))
            for w in self._window_set
            if w < length
        }
        contiguous = rows[-1] - rows[0] == b - 1
        row_index = (
            slice(rows[0], rows[0] + b)
            if contiguous
            else torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
        )
        flat = padded.view(-1).to(device, non_blocking=True)
        row_ids, lens_t = torch.tensor(rows, dtype=torch.int64), torch.tensor(lens)
        return DecodeGroup(row_index, flat, b, length, mask, row_ids, lens_t, kernels, windowed)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        pool: KVPool,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        k_buf, v_buf = pool.k_buffers[layer], pool.v_buffers[layer]
        window = self.windows[layer] if self.windows else None
        group = meta.decode
        if group is not None and not meta.spans:  # decode-only step: rows are all of `q`
            return self._decode(q, k, v, k_buf, v_buf, group, meta.out_slots, window)
        k_buf.index_copy_(0, meta.out_slots, k)
        v_buf.index_copy_(0, meta.out_slots, v)
        out = torch.empty(
            q.shape[0], self.num_heads * self.head_dim, dtype=q.dtype, device=q.device
        )
        if group is not None:
            out[group.rows] = self._decode(q, k, v, k_buf, v_buf, group, None, window)
        for span in meta.spans:
            rows = slice(span.q_start, span.q_start + span.q_len)
            mask = span.window_masks.get(window) if window is not None else None
            if mask is not None:
                out[rows] = self._one_sequence(q[rows], k_buf, v_buf, span, mask)
            elif span.fresh:
                out[rows] = self._causal(q[rows], k[rows], v[rows])
            else:
                out[rows] = self._one_sequence(q[rows], k_buf, v_buf, span, span.mask)
        return out

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # A sequence without cached prefix: its K/V are exactly the new rows, and the mask is
        # the plain causal one, which SDPA handles without materialising it.
        n = q.shape[0]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            is_causal=True,
            scale=self.scale,
            enable_gqa=self.group > 1,
        )
        return o.transpose(0, 1).reshape(n, self.num_heads * self.head_dim)

    def _one_sequence(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        span: SeqSpan,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        n, hkv, g, d = span.q_len, self.num_kv_heads, self.group, self.head_dim
        # [n, H, D] -> [Hkv, g * n, D]: rows of one KV head ordered (query head in group, token).
        qg = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
        keys = k_buf.index_select(0, span.kv_indices).transpose(0, 1)  # [Hkv, L, D]
        values = v_buf.index_select(0, span.kv_indices).transpose(0, 1)
        o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=self.scale)
        return o.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hkv * g * d)

    def _decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        group: DecodeGroup,
        out_slots: torch.Tensor | None,
        window: int | None = None,
    ) -> torch.Tensor:
        """The group's rows of `q` (all `T` rows of the step) attend; `out_slots`: the new K/V
        are not stored yet, store them there first. `window`: the layer's sliding window."""
        window_mask = group.window_masks.get(window) if window is not None else None
        if group.kernels is not None and window_mask is None:
            return group.kernels.decode_attention(
                q, k, v, k_buf, v_buf, group, self.scale, out_slots
            )
        if out_slots is not None:
            k_buf.index_copy_(0, out_slots, k)
            v_buf.index_copy_(0, out_slots, v)
        b, hkv, g, d = group.batch, self.num_kv_heads, self.group, self.head_dim
        qg = q[group.rows].reshape(b, hkv, g, d)
        shape = (b, group.length, hkv, d)
        keys = k_buf.index_select(0, group.kv).view(shape).transpose(1, 2)  # [B, Hkv, L, D]
        values = v_buf.index_select(0, group.kv).view(shape).transpose(1, 2)
        mask = group.mask if window_mask is None else window_mask
        o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=self.scale)
        return o.reshape(b, hkv * g * d)
