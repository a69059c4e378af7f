"""The Llama-architecture decoder in plain torch, over a flat ragged batch.

All `T` new tokens of all sequences go through every matmul together (one `[T, hidden]` activation
per layer); attention sees the ragged batch through an `AttentionBackend`. Q/K/V and gate/up
projections are fused into one weight each at load time, so a layer costs four matmuls.
Numerics follow the Hugging Face Llama implementation (RMSNorm in float32, rotate-half RoPE) so the
logits can be compared against it.

On a CPU a decode step is a few hundred small ops besides the matmuls, so each op counts: one RoPE
over Q and K together, RMSNorm as one fused op. The matmuls run on oneDNN-packed weights once
`pack_weights` has been called (see `corral.engine.kernels.matmul`). In bfloat16 on the CPU (the quantized
path) the norms (the second fused with its residual add), RoPE and silu * up are C kernels
instead (`corral.engine.kernels.cpu_kernels`), chosen once per forward pass.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from corral.engine.execution.attention import AttentionBackend, AttentionMetadata
from corral.engine.execution.model_config import ModelConfig, RopeConfig
from corral.engine.execution.moe import MoEBlock
from corral.engine.kernels.cpu_kernels import CpuKernels, kernels_for
from corral.engine.kernels.fused_decode import SWITCH_ENV as FUSED_SWITCH_ENV
from corral.engine.kernels.fused_decode import FusedDecode
from corral.engine.kernels.matmul import (
    PACK_BATCH_HINT,
    Linear,
    can_pack,
    linear_fn,
    pack_weight,
    packed_linear,
)
from corral.engine.kernels.quant import MatmulWeight, any_linear
from corral.engine.kvcache.kv_pool import KVPool


def set_weight(
    module: nn.Module, name: str, value, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    """Replace attribute `name` (a registered parameter, or None) by `value` of `shape`: a dense
    tensor becomes a parameter in `dtype`; anything else (a quantized weight, a table with
    `lookup`) is kept as it is, and the module's matmul learns to run it (`any_linear`)."""
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(value.shape)} does not fit {tuple(shape)}")
    if isinstance(value, torch.Tensor):
        if not isinstance(value, nn.Parameter):
            value = nn.Parameter(value.to(dtype), requires_grad=False)
    else:
        module.linear = any_linear(module.linear)
    if name in module._parameters:
        delattr(module, name)  # unregisters it, so a dense predecessor's memory is freed
    setattr(module, name, value)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, kernels: CpuKernels | None = None
) -> torch.Tensor:
    """RMSNorm over the last axis, one fused op (accumulates in float32 for bfloat16 inputs);
    with `kernels`, their C kernel (the same numerics, bit for bit)."""
    if kernels is not None:
        return kernels.rms_norm(x, weight, eps)
    return F.rms_norm(x, weight.shape, weight, eps)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies `[head_dim // 2]` (float32), with the rope type's scaling applied
    (`head_dim`: the rotated dims, less than the head's for partial rotary)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    if rope.rope_type == "yarn":
        return _yarn_scaled(inv_freq, rope, head_dim)
    if rope.rope_type == "longrope":
        factors = torch.tensor(rope.ext_factors, dtype=torch.float32)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"longrope needs {inv_freq.numel()} factors, got {factors.numel()}")
        return 1.0 / (factors * rope.theta**exponents)
    return inv_freq


def _yarn_scaled(inv_freq: torch.Tensor, rope: RopeConfig, dim: int) -> torch.Tensor:
    # YaRN: high frequencies (many rotations over the original context) are kept, low ones
    # divided by `factor`, with a linear ramp between the two correction dims.
    def correction_dim(rotations: float) -> float:
        old_len = rope.original_max_position_embeddings
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return inv_freq / rope.factor * (1 - keep) + inv_freq * keep


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between
    # interpolated smoothly.
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and *signed* sin tables `[T, 1, rotary_dim]` for the given positions (float32 math),
    multiplied by `scale` (YaRN's and LongRoPE's attention factor).

    The sin table's first half is negated, which folds rotate-half's negation into the table
    (see `apply_rope`).
    """
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return (
        torch.cat((cos, cos), dim=-1).to(dtype)[:, None, :],
        torch.cat((-sin, sin), dim=-1).to(dtype)[:, None, :],
    )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on `[T, heads, head_dim]` with tables from `rope_cos_sin`.

    `rotate_half(x) * sin == roll(x, half) * signed_sin`: the roll swaps the halves, the table
    carries the sign. Three ops instead of five.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)). Weights are set by the loader.

    The architectures' differences are hooks here, each absent (None) where a model lacks it:
    `q_norm`/`k_norm` (per-head RMSNorm before RoPE), `attn_out_norm`/`mlp_out_norm` (Gemma's
    norms on the two branches' outputs), no rope (`cos is None`), partial rotary, GeGLU, and a
    mixture of experts (`moe`) in place of the MLP. A layer with none of them runs `_plain`.
    """

    MATMUL_WEIGHTS = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")

    def __init__(
        self,
        config: ModelConfig,
        index: int,
        dtype: torch.dtype,
        device: torch.device,
        dense_matmuls: bool = True,
    ):
        """`dense_matmuls=False` leaves the four matmul weights unset (None): a quantized loader
        puts them in with `set_matmul_weight`, so no full-size dense copy is ever allocated."""
        super().__init__()
        c = config
        self.index = index
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.hidden_size, self.intermediate_size = c.hidden_size, c.intermediate_size
        self.eps = c.rms_norm_eps
        self.plain = c.plain
        self.rotary_dim = c.rotary_dim
        self.gelu = c.hidden_act == "gelu_pytorch_tanh"

        def p(*shape: int, present: bool = True) -> nn.Parameter | None:
            if not present:
                return None
            return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)

        d = dense_matmuls
        sparse = c.moe is not None and c.moe.sparse_layers[index]
        self.input_norm = p(c.hidden_size)
        self.qkv_weight = p(self.q_size + 2 * self.kv_size, c.hidden_size, present=d)
        self.qkv_bias = p(self.q_size + 2 * self.kv_size, present=c.qkv_bias)
        self.q_norm = p(c.head_dim, present=c.qk_norm)
        self.k_norm = p(c.head_dim, present=c.qk_norm)
        self.o_weight = p(c.hidden_size, self.q_size, present=d)
        self.o_bias = p(c.hidden_size, present=c.o_bias)
        self.attn_out_norm = p(c.hidden_size, present=c.sandwich_norms)
        self.post_norm = p(c.hidden_size)
        self.gate_up_weight = p(2 * c.intermediate_size, c.hidden_size, present=d and not sparse)
        self.gate_up_bias = p(2 * c.intermediate_size, present=c.mlp_bias)
        self.down_weight = p(c.hidden_size, c.intermediate_size, present=d and not sparse)
        self.down_bias = p(c.hidden_size, present=c.mlp_bias)
        self.mlp_out_norm = p(c.hidden_size, present=c.sandwich_norms)
        self.moe = MoEBlock(c.hidden_size, c.moe, dtype, device) if sparse else None
        self.linear: Linear = linear_fn(dtype, device)

    @property
    def matmul_names(self) -> tuple[str, ...]:
        """The layer's own matmul weights (a MoE layer's MLP weights live in `moe`)."""
        return self.MATMUL_WEIGHTS[:2] if self.moe is not None else self.MATMUL_WEIGHTS

    def matmul_shape(self, name: str) -> tuple[int, int]:
        """`[out_features, in_features]` of one of `MATMUL_WEIGHTS`."""
        hidden, inter = self.hidden_size, self.intermediate_size
        return {
            "qkv_weight": (self.q_size + 2 * self.kv_size, hidden),
            "o_weight": (hidden, self.q_size),
            "gate_up_weight": (2 * inter, hidden),
            "down_weight": (hidden, inter),
        }[name]

    def set_matmul_weight(self, name: str, weight: MatmulWeight) -> None:
        """Put a dense or quantized matmul weight in place (the loader's door)."""
        set_weight(self, name, weight, self.matmul_shape(name), self.input_norm.dtype)

    def pack_weights(self, batch_hint: int) -> None:
        """Replace the dense matmul weights by oneDNN-packed copies, dropping the dense ones
        (quantized ones stay as they are)."""
        quantized = False
        for name in self.matmul_names:
            w = getattr(self, name)
            if not isinstance(w, torch.Tensor):
                quantized = True
                continue
            packed = pack_weight(w, batch_hint)
            delattr(self, name)  # unregisters the parameter, so its memory is freed
            setattr(self, name, packed)
        self.linear = any_linear(packed_linear) if quantized else packed_linear

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        attn: AttentionBackend,
        pool: KVPool,
        meta: AttentionMetadata,
        kernels: CpuKernels | None = None,
    ) -> torch.Tensor:
        """`cos`/`sin`: this layer's rope tables, None for a layer without rope. `kernels`: run
        the small ops as C kernels (bfloat16 CPU activations, plain layers only)."""
        if self.plain:
            return self._plain(x, cos, sin, attn, pool, meta, kernels)
        t, qk_size, linear, eps = x.shape[0], self.q_size + self.kv_size, self.linear, self.eps
        qkv = linear(rms_norm(x, self.input_norm, eps), self.qkv_weight, self.qkv_bias)
        q = qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim)
        k = qkv[:, self.q_size : qk_size].view(t, self.num_kv_heads, self.head_dim)
        v = qkv[:, qk_size:].view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, eps), rms_norm(k, self.k_norm, eps)
        if cos is not None:
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        y = linear(attn.forward(q, k, v, self.index, pool, meta), self.o_weight, self.o_bias)
        if self.attn_out_norm is not None:
            y = rms_norm(y, self.attn_out_norm, eps)
        x = x + y
        h = rms_norm(x, self.post_norm, eps)
        y = self.moe(h, linear) if self.moe is not None else self._mlp(h)
        if self.mlp_out_norm is not None:
            y = rms_norm(y, self.mlp_out_norm, eps)
        return x + y

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot = self.rotary_dim
        if rot == self.head_dim:
            return apply_rope(x, cos, sin)
        return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.linear(h, self.gate_up_weight, self.gate_up_bias).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.linear(act.mul_(up), self.down_weight, self.down_bias)

    def _plain(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
        pool: KVPool,
        meta: AttentionMetadata,
        kernels: CpuKernels | None,
    ) -> torch.Tensor:
        t, qk_size, linear, eps = x.shape[0], self.q_size + self.kv_size, self.linear, self.eps
        qkv = linear(rms_norm(x, self.input_norm, eps, kernels), self.qkv_weight, self.qkv_bias)
        # Q and K are adjacent columns: rotate them as one [T, heads + kv_heads, head_dim] view.
        qk = qkv[:, :qk_size].view(t, -1, self.head_dim)
        qk = apply_rope(qk, cos, sin) if kernels is None else kernels.rope_(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, qk_size:].view(t, self.num_kv_heads, self.head_dim)
        o = attn.forward(q, k, v, self.index, pool, meta)
        y = linear(o, self.o_weight, self.o_bias)
        if kernels is None:
            x = x + y
            h = linear(rms_norm(x, self.post_norm, eps), self.gate_up_weight, self.gate_up_bias)
            gate, up = h.chunk(2, dim=-1)
            return x + linear(F.silu(gate).mul_(up), self.down_weight, self.down_bias)
        h = kernels.add_rms_norm_(x, y, self.post_norm, eps)  # y becomes the residual stream
        h = linear(h, self.gate_up_weight, self.gate_up_bias)
        return y + linear(kernels.silu_mul(h), self.down_weight, self.down_bias)


class DecoderModel(nn.Module):
    """Embedding, `num_layers` decoder layers, final norm and LM head (tied or not)."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        dense_matmuls: bool = True,
    ):
        """`dtype`: the activations' (and dense weights') dtype. `dense_matmuls=False`: the
        layers' matmul weights, the embedding and the LM head are left for a quantized loader
        (`set_matmul_weight`, `set_embedding`, `set_lm_head`)."""
        super().__init__()
        device = torch.device(device)
        c = config
        self.config = c
        self.dtype, self.device = dtype, device
        self.embed = None  # a dense Parameter, or a table with `lookup` (`set_embedding`)
        self.lm_head: MatmulWeight | None = None
        if dense_matmuls:
            self.embed = nn.Parameter(
                torch.empty(c.vocab_size, c.hidden_size, dtype=dtype, device=device),
                requires_grad=False,
            )
            # Tied models share the embedding tensor; `lm_head` is then another name for it.
            self.lm_head = (
                self.embed
                if c.tie_word_embeddings
                else nn.Parameter(torch.empty_like(self.embed), requires_grad=False)
            )
        self.layers = nn.ModuleList(
            DecoderLayer(c, i, dtype, device, dense_matmuls) for i in range(c.num_layers)
        )
        self.norm = nn.Parameter(torch.empty(c.hidden_size, dtype=dtype, device=device), False)
        self.register_buffer("inv_freq", rope_inv_freq(c.rope, c.rotary_dim).to(device), False)
        local = rope_inv_freq(c.local_rope, c.rotary_dim) if c.local_rope else torch.empty(0)
        self.register_buffer("local_inv_freq", local.to(device), False)
        self.linear: Linear = linear_fn(dtype, device)
        self.packed_head: torch.Tensor | None = None  # set by `pack_weights`
        self._fused: tuple[CpuKernels, FusedDecode | None] | None = None  # `_fused_decode`

    def set_embedding(self, table) -> None:
        """The token embedding: a dense `[vocab, hidden]` tensor, or any table with `shape` and
        `lookup(ids, dtype)` (`gguf_weights.GGUFRows`)."""
        c = self.config
        set_weight(self, "embed", table, (c.vocab_size, c.hidden_size), self.dtype)

    def set_lm_head(self, weight: MatmulWeight) -> None:
        """The LM head (`[vocab, hidden]`), dense or quantized."""
        c = self.config
        set_weight(self, "lm_head", weight, (c.vocab_size, c.hidden_size), self.dtype)

    @property
    def packed(self) -> bool:
        """Whether `pack_weights` has moved the matmuls onto packed weights."""
        return self.packed_head is not None

    def pack_weights(self, batch_hint: int = PACK_BATCH_HINT) -> bool:
        """Move every matmul onto oneDNN-packed weights (CPU, float32 or bfloat16); one-way.

        The layers' dense matmul weights are dropped; the embedding stays dense for the token
        lookup, so a tied LM head gets a packed copy beside it. Returns False, changing nothing,
        where packing is unavailable.
        """
        if self.packed:
            return True
        if not can_pack(self.dtype, self.device):
            return False
        for layer in self.layers:
            layer.pack_weights(batch_hint)
        if isinstance(self.lm_head, torch.Tensor):
            self.packed_head = pack_weight(self.lm_head, batch_hint)
            self.linear = packed_linear
        else:  # a quantized head is already in its kernel's layout
            self.packed_head = self.lm_head
            self.linear = any_linear(packed_linear)
        return True

    def _fused_decode(
        self, kernels: CpuKernels | None, attn: AttentionBackend, meta: AttentionMetadata
    ) -> FusedDecode | None:
        """The layers as one C call each (`engine.fused_decode`) for a decode-only step with the
        C kernels, where every layer can run so; else None (built once per kernel library)."""
        group = meta.decode
        if kernels is None or group is None or group.kernels is None or meta.spans:
            return None
        if not self.config.plain or os.environ.get(FUSED_SWITCH_ENV) == "0":
            return None
        if self._fused is None or self._fused[0] is not kernels:
            self._fused = (kernels, FusedDecode.for_model(self, kernels, attn.scale))
        return self._fused[1]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_index: torch.Tensor,
        attn: AttentionBackend,
        pool: KVPool,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Logits (float32) `[len(logits_index), vocab_size]` for the selected rows only."""
        x = (
            F.embedding(input_ids, self.embed)
            if isinstance(self.embed, torch.Tensor)
            else self.embed.lookup(input_ids, self.dtype)
        )
        c = self.config
        if c.embed_scale != 1.0:
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        ropes = self._rope_tables(positions, x.dtype)
        kernels = kernels_for(x.dtype, x.device)
        fused = self._fused_decode(kernels, attn, meta)
        if fused is not None:
            x = fused.run(x, *ropes["global"], pool, meta)
        else:
            if not c.plain:
                kernels = None  # the C kernels cover the plain layer only
            for i, layer in enumerate(self.layers):
                x = layer(x, *ropes[c.rope_kind(i)], attn, pool, meta, kernels)
        # The final norm and the LM head (the biggest matmul for small models) only on the rows
        # whose logits are wanted.
        h = rms_norm(x[logits_index], self.norm, c.rms_norm_eps, kernels)
        head = self.lm_head if self.packed_head is None else self.packed_head
        logits = self.linear(h, head, None).float()
        if c.final_logit_softcap:
            cap = c.final_logit_softcap
            logits = torch.tanh(logits / cap).mul_(cap)
        return logits

    def _rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> dict:
        """cos/sin tables by rope kind ("global", "local", "none": no tables)."""
        c = self.config
        tables: dict = {"none": (None, None)}
        tables["global"] = rope_cos_sin(positions, self.inv_freq, dtype, c.rope.attention_factor)
        if c.local_rope is not None:
            scale = c.local_rope.attention_factor
            tables["local"] = rope_cos_sin(positions, self.local_inv_freq, dtype, scale)
        return tables
