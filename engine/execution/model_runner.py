"""Runs the model on one ragged batch; the scheduler's only door into torch.

The scheduler describes a step as a `ForwardBatch` (which new tokens, at which positions, stored in
which KV slots, attending over which slots) and gets back logits for the rows it asked for. The
runner makes no policy decisions: it does not allocate slots, choose sequences or sample.

On CUDA the attention backend is Triton paged attention (`attention_triton`), on the CPU torch SDPA
(`attention`). Decode steps can replay CUDA graphs captured per batch-size bucket
(`cuda_graphs`, `use_decode_graphs`); every other step, and every step without them, runs eagerly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from corral.engine.execution.attention import AttentionBackend, TorchAttention
from corral.engine.execution.batch import ForwardBatch, fill_pending
from corral.engine.execution.model import DecoderModel
from corral.engine.execution.model_config import ModelConfig
from corral.engine.kvcache.kv_pool import KVPool

if TYPE_CHECKING:
    from corral.engine.execution.cuda_graphs import DecodeGraphs

log = logging.getLogger(__name__)


def default_attention(c: ModelConfig, device: torch.device) -> AttentionBackend:
    """Triton paged attention on CUDA, torch SDPA over gathered K/V on the CPU (and on CUDA for
    a head size the kernels do not take: not a power of two >= 16, e.g. 80; logged)."""
    if device.type == "cuda":
        from corral.engine.execution.attention_triton import TritonAttention

        try:
            return TritonAttention(
                c.num_heads, c.num_kv_heads, c.head_dim, c.attn_scale, c.layer_windows
            )
        except ValueError as e:
            log.warning("attention falls back to torch SDPA over gathered K/V: %s", e)
    return TorchAttention(c.num_heads, c.num_kv_heads, c.head_dim, c.attn_scale, c.layer_windows)


class ModelRunner:
    """Owns the model and its attention backend; turns a `ForwardBatch` into logits."""

    def __init__(
        self,
        model: DecoderModel,
        attention: AttentionBackend | None = None,
        pack_weights: bool = True,
    ) -> None:
        """`pack_weights`: move the matmuls onto oneDNN-packed weights where the device and dtype
        allow (`DecoderModel.pack_weights`; the runner then owns the model)."""
        self.model = model.eval()
        if pack_weights:
            model.pack_weights()
        self.config: ModelConfig = model.config
        c = self.config
        self.dtype = model.dtype
        self.device = model.device
        self.attention = attention or default_attention(c, self.device)
        self.decode_graphs: DecodeGraphs | None = None

    def use_decode_graphs(
        self, pool: KVPool, max_batch: int, max_len: int, capture: bool = True
    ) -> DecodeGraphs | None:
        """Run decode steps of up to `max_batch` sequences over `pool` through static buffers,
        replayed from CUDA graphs (`capture`; CUDA with Triton attention only, else logged and
        None) or run eagerly from the same buffers (`capture=False`, any device)."""
        from corral.engine.execution.attention_triton import TritonAttention
        from corral.engine.execution.cuda_graphs import DecodeGraphs

        if capture and not (
            self.device.type == "cuda" and isinstance(self.attention, TritonAttention)
        ):
            log.warning("no CUDA graphs: they need CUDA and the Triton attention backend")
            return None
        self.decode_graphs = DecodeGraphs(self, pool, max_batch, max_len, capture)
        return self.decode_graphs

    def make_kv_pool(self, num_slots: int) -> KVPool:
        """A pool shaped for this model (layers, KV heads, head dim, dtype, device)."""
        c = self.config
        return KVPool(c.num_layers, c.num_kv_heads, c.head_dim, num_slots, self.dtype, self.device)

    def kv_pool_from_budget(self, budget_bytes: int) -> KVPool:
        """The largest pool for this model that fits in `budget_bytes`."""
        c = self.config
        return KVPool.from_budget(
            budget_bytes, c.num_layers, c.num_kv_heads, c.head_dim, self.dtype, self.device
        )

    def forward(
        self, batch: ForwardBatch, pool: KVPool, prev_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Store the new tokens' K/V in `pool` and return float32 logits
        `[len(batch.logits_index), vocab_size]`. `prev_tokens`: the previous step's sampled
        tokens, still on the device, for `batch.pending`."""
        self._check(batch, pool)
        with torch.inference_mode():
            return self._run(batch, pool, prev_tokens)

    def _run(
        self, batch: ForwardBatch, pool: KVPool, prev_tokens: torch.Tensor | None
    ) -> torch.Tensor:
        graphs = self.decode_graphs
        if graphs is not None and graphs.fits(batch, pool):
            return graphs.run(batch, prev_tokens)
        dev = self.device
        input_ids = batch.input_ids.to(dev, non_blocking=True)
        fill_pending(input_ids, batch, prev_tokens, dev)
        out_slots = batch.out_slots.to(dev, non_blocking=True)
        meta = self.attention.prepare(
            out_slots, batch.seq_kv_indices, batch.extend_lens, dev, self.dtype
        )
        return self.model(
            input_ids,
            batch.positions.to(dev, non_blocking=True),
            batch.logits_index.to(dev, non_blocking=True),
            self.attention,
            pool,
            meta,
        )

    def _check(self, batch: ForwardBatch, pool: KVPool) -> None:
        t = batch.num_tokens
        if not (batch.positions.numel() == batch.out_slots.numel() == t == sum(batch.extend_lens)):
            raise ValueError(
                f"ForwardBatch is inconsistent: {t} input_ids, {batch.positions.numel()} "
                f"positions, {batch.out_slots.numel()} out_slots, sum(extend_lens)="
                f"{sum(batch.extend_lens)}"
            )
        if len(batch.seq_kv_indices) != len(batch.extend_lens):
            raise ValueError("ForwardBatch needs one seq_kv_indices entry per extend_lens entry")
        if pool.dtype != self.dtype or len(pool.k_buffers) != self.config.num_layers:
            raise ValueError(
                f"KV pool ({pool.dtype}, {len(pool.k_buffers)} layers) does not match the model "
                f"({self.dtype}, {self.config.num_layers} layers); build it with make_kv_pool()"
            )
