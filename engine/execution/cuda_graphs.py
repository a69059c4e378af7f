"""Decode steps through static buffers, replayed from CUDA graphs captured per batch-size bucket.

A decode step (every sequence extends by one token) launches a few hundred small kernels; on a
GPU their launch cost is most of a small batch's step. So decode steps of up to `max_batch`
sequences run from CUDA graphs, one captured per bucket (1, 2, 4, 8, 16, 32, 64, ..., and
`max_batch` itself), and a step of `n` sequences replays the smallest bucket `b >= n`.

Nothing of one step is baked into a graph: it reads every input from static buffers that each
step overwrites before the replay (token ids, positions, the slots the new K/V go to, and the
paged decode kernel's slot table, per-row slot offsets and lengths, all as tensors). The `b - n`
padding rows decode token 0 at position 0 over one slot, `PAD_SLOT`, and store their K/V there
(the pool reserves it as scratch: it is never handed out, its contents are always finite); their
logits are dropped. The decode kernel's split of long contexts is fixed at capture for the
longest context allowed (`TritonAttention.decode_splits`); a split past a row's end is empty and
weighs nothing.

Prefill and extend steps (and decode batches past `max_batch`) run eagerly, as does every step
with `--no-cuda-graphs` (`EngineConfig.cuda_graphs`). `capture=False` runs the same static-buffer
path eagerly, with the attention backend's own metadata built from those buffers: how the CPU
tests check everything here but the capture itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from corral.engine.execution.batch import fill_pending
from corral.engine.kvcache.kv_pool import PAD_SLOT, KVPool

if TYPE_CHECKING:
    from corral.engine.execution.batch import ForwardBatch
    from corral.engine.execution.model_runner import ModelRunner


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes a graph is captured for: powers of two below `max_batch`, then `max_batch`."""
    buckets = [1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch]
    return [*buckets, max_batch]


class DecodeGraphs:
    """Static decode buffers for `runner` over `pool`, and (with `capture`) one CUDA graph per
    bucket that replays a decode step from them."""

    def __init__(
        self,
        runner: ModelRunner,
        pool: KVPool,
        max_batch: int,
        max_len: int,
        capture: bool = True,
    ) -> None:
        """`max_len`: the longest context a sequence may reach (the slot table's row width)."""
        if max_batch < 1 or max_len < 1:
            raise ValueError(f"DecodeGraphs needs max_batch, max_len >= 1: {max_batch}, {max_len}")
        self.runner, self.pool = runner, pool
        self.max_batch, self.max_len = max_batch, max_len
        self.buckets = decode_buckets(max_batch)
        dev = runner.device
        i64, i32 = dict(dtype=torch.int64, device=dev), dict(dtype=torch.int32, device=dev)
        self.input_ids = torch.zeros(max_batch, **i64)
        self.positions = torch.zeros(max_batch, **i64)
        self.out_slots = torch.full((max_batch,), PAD_SLOT, **i64)
        self.logits_index = torch.arange(max_batch, **i64)
        self.kv_slots = torch.full((max_batch * max_len + 1,), PAD_SLOT, **i32)
        # The decode kernel's table: (row of q, offset in kv_slots, kv length) per row.
        self.table = torch.zeros(3, max_batch, **i32)
        self.table[0] = torch.arange(max_batch, **i32)
        self.table[2] = 1
        # bucket -> (graph, its output logits, the metadata its kernels read: kept alive)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, object]] = {}
        self.steps = 0  # decode steps run through the buffers (tests, benches)
        if capture:
            self._capture_all()

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def fits(self, batch: ForwardBatch, pool: KVPool) -> bool:
        """A decode-only batch of at most `max_batch` sequences over the pool captured for."""
        n = len(batch.extend_lens)
        return (
            pool is self.pool
            and 0 < n <= self.max_batch
            and batch.num_tokens == n
            and all(int(kv.numel()) <= self.max_len for kv in batch.seq_kv_indices)
        )

    def run(self, batch: ForwardBatch, prev_tokens: torch.Tensor | None) -> torch.Tensor:
        """Float32 logits `[len(batch.logits_index), vocab]` of a batch that `fits`."""
        n = batch.num_tokens
        b = next(size for size in self.buckets if size >= n)
        self._stage(batch, b, prev_tokens)
        self.steps += 1
        if self._graphs:
            graph, logits, _ = self._graphs[b]
            graph.replay()
        else:
            logits = self._forward(b, self._eager_metadata(b))
        # A copy: the next replay overwrites the graph's output.
        return logits.index_select(0, batch.logits_index.to(logits.device, non_blocking=True))

    def _stage(self, batch: ForwardBatch, b: int, prev_tokens: torch.Tensor | None) -> None:
        """Copy the real rows into the buffers' first `n` rows and reset rows `n:b` to padding."""
        n, dev = batch.num_tokens, self.runner.device
        lens = [int(kv.numel()) for kv in batch.seq_kv_indices]
        starts = torch.tensor([0, *lens[:-1]], dtype=torch.int64).cumsum(0)
        total = sum(lens)
        # kv_slots[total] is PAD_SLOT: every padding row reads that one slot.
        flat = torch.cat([*batch.seq_kv_indices, torch.tensor([PAD_SLOT])]).to(torch.int32)
        self.kv_slots[: total + 1].copy_(flat, non_blocking=True)
        pad = b - n
        self.table[1, :b].copy_(torch.cat([starts, torch.full((pad,), total)]), non_blocking=True)
        self.table[2, :b].copy_(torch.tensor(lens + [1] * pad), non_blocking=True)
        for buf, real, fill in (
            (self.input_ids, batch.input_ids, 0),
            (self.positions, batch.positions, 0),
            (self.out_slots, batch.out_slots, PAD_SLOT),
        ):
            buf[:n].copy_(real, non_blocking=True)
            buf[n:b].fill_(fill)
        fill_pending(self.input_ids, batch, prev_tokens, dev)

    def _forward(self, b: int, meta) -> torch.Tensor:
        model = self.runner.model
        return model(
            self.input_ids[:b],
            self.positions[:b],
            self.logits_index[:b],
            self.runner.attention,
            self.pool,
            meta,
        )

    def _eager_metadata(self, b: int):
        """The backend's own `prepare`, over the slot lists read back from the static buffers."""
        starts, lens = self.table[1, :b].tolist(), self.table[2, :b].tolist()
        kvs = [self.kv_slots[s : s + n].to(torch.int64) for s, n in zip(starts, lens, strict=True)]
        dev, dtype = self.runner.device, self.runner.dtype
        return self.runner.attention.prepare(self.out_slots[:b], kvs, [1] * b, dev, dtype)

    def _graph_metadata(self, b: int):
        """Triton decode metadata that points into the static buffers (sliced to `b` rows)."""
        from corral.engine.execution.attention_triton import (
            DecodeRows,
            TritonAttention,
            TritonMetadata,
        )

        attn = self.runner.attention
        if not isinstance(attn, TritonAttention):
            raise ValueError("CUDA graphs need the Triton attention backend")
        splits, split_len = attn.decode_splits(self.max_len)
        partials = None
        if splits > 1:
            shape = (b, attn.num_heads, splits)
            f32 = dict(dtype=torch.float32, device=self.runner.device)
            partials = (
                torch.empty(shape, **f32),
                torch.empty(shape, **f32),
                torch.empty((*shape, attn.head_dim), **f32),
            )
        decode = DecodeRows(self.table[:, :b], splits, split_len, partials)
        return TritonMetadata(self.out_slots[:b], b, self.kv_slots, decode, None)

    def _capture_all(self) -> None:
        """Largest bucket first, all in one memory pool (the smaller graphs reuse its blocks)."""
        mempool = None
        with torch.inference_mode():
            for b in reversed(self.buckets):
                meta = self._graph_metadata(b)
                graph, logits = _capture(lambda b=b, meta=meta: self._forward(b, meta), mempool)
                mempool = graph.pool()
                self._graphs[b] = (graph, logits, meta)
        torch.cuda.synchronize(self.runner.device)


def _capture(
    step: Callable[[], torch.Tensor], mempool
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm `step` up on a side stream (Triton compiles, allocator settles), then capture it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=mempool):
        logits = step()
    return graph, logits
