"""A decode-only CPU step with one C call per decoder layer (`corral_decode_layer`).

A batch-1 decode step of a small model on the CPU is mostly Python: ten kernel calls per layer,
each with its argument checks, tensor allocations and a ctypes round trip, cost more than the
layer's arithmetic. `csrc/decode.c`'s `corral_decode_layer` runs the same kernels in the same
order (RMSNorm, the int4 Q/K/V matmul, RoPE, paged decode attention, the output matmul, the
residual add with the second norm, gate/up, silu × up, down, the residual add) behind one call,
so its result is the same bit for bit as the layer-by-layer path (`tests/engine/
test_engine_fused_decode.py`) and only the Python between them is gone.

It applies where every layer can run it: bfloat16 on the CPU with both C libraries built (the
decode kernels and the int4 matmul), every matmul weight an `Int4Weight` on the int4 kernel's
grid (not Q8_0's split form), no biases, and a step whose rows all decode (no prefill chunk, no
draft). Anything else runs the layers one by one, as before, and so does every step with
`CORRAL_FUSED_DECODE=0`. The weights' pointers and shapes are
checked once; each step checks its own tensors (rows, RoPE tables, KV buffers, slot indices),
and the attention kernel checks every slot index against the pool, as on the unfused path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from corral.engine.execution.attention import AttentionMetadata
from corral.engine.kernels.cpu_int4 import int4_kernel
from corral.engine.kernels.cpu_kernels import (
    HEAD_DIM_MULTIPLE,
    CpuKernels,
    KernelError,
    _dense,
    _index,
)
from corral.engine.kernels.quant import Int4Weight
from corral.engine.kvcache.kv_pool import KVPool

SWITCH_ENV = "CORRAL_FUSED_DECODE"  # "0": the layers one by one
_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_LAYER_ARGS = (
    (_P, _P, _I64, _I64, _P, _P, _F)  # x, out, b, hidden, norm1, norm2, eps
    + (_P, _P) * 4  # (packed, scales) of qkv, o, gate_up, down
    + (_I64, _P, _P, _I64, _I64, _I64)  # inter, cos, ssin, heads, hkv, d
    + (_P, _P, _I64, _P, _P, _P, _I64, _P)  # k_pool, v_pool, slots, rows, kv, lens, length, out
    + (_F, _INT)  # scale, threads
)


@dataclass(frozen=True)
class _Layer:
    """One layer's arguments that do not change between steps (checked once)."""

    index: int
    norms: tuple[int, int]
    eps: float
    weights: tuple[int, ...]  # (packed, scales) pointers of qkv, o, gate_up, down
    keep: tuple[torch.Tensor, ...]  # the tensors behind the pointers, kept alive


class FusedDecode:
    """The model's layers as `corral_decode_layer` calls; `for_model` says whether it applies."""

    def __init__(self, fn, layers: list[_Layer], dims: tuple[int, int, int, int, int], scale):
        self._fn, self._layers = fn, layers
        self.hidden, self.inter, self.heads, self.hkv, self.d = dims
        self.scale = scale

    @classmethod
    def for_model(cls, model, kernels: CpuKernels, scale: float) -> FusedDecode | None:
        """The fused layers of `model` (a `DecoderModel`), or None where a layer cannot run
        fused (see the module docstring)."""
        if int4_kernel() is None or not model.layers:
            return None
        first = model.layers[0]
        dims = (first.hidden_size, first.intermediate_size, first.num_heads,
                first.num_kv_heads, first.head_dim)  # fmt: skip
        hidden, inter, heads, hkv, d = dims
        if heads % hkv or d % HEAD_DIM_MULTIPLE:
            return None
        shapes = {"qkv_weight": ((heads + 2 * hkv) * d, hidden), "o_weight": (hidden, heads * d),
                  "gate_up_weight": (2 * inter, hidden), "down_weight": (hidden, inter)}  # fmt: skip
        layers = []
        for layer in model.layers:
            if any(getattr(layer, b) is not None for b in ("qkv_bias", "o_bias", "gate_up_bias",
                                                           "down_bias")):  # fmt: skip
                return None
            keep, ptrs = [], []
            for name, (n, k) in shapes.items():
                w = getattr(layer, name)
                if not (isinstance(w, Int4Weight) and w.shape == (n, k) and not w.split_input):
                    return None
                if not int4_kernel().fits(n, k) or w.scales_zeros.dtype != torch.bfloat16:
                    return None
                if not (w.packed.is_contiguous() and w.scales_zeros.is_contiguous()):
                    return None
                keep += [w.packed, w.scales_zeros]
                ptrs += [w.packed.data_ptr(), w.scales_zeros.data_ptr()]
            norms = (_dense(layer.input_norm, "input_norm", (hidden,)),
                     _dense(layer.post_norm, "post_norm", (hidden,)))  # fmt: skip
            keep += [layer.input_norm, layer.post_norm]
            layers.append(_Layer(layer.index, norms, layer.eps, tuple(ptrs), tuple(keep)))
        fn = kernels.decode_layer_fn
        fn.argtypes, fn.restype = _LAYER_ARGS, ctypes.c_int
        return cls(fn, layers, dims, scale)

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        pool: KVPool,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Every layer on `x [b, hidden]` for a decode-only step (`meta.decode` covers all rows,
        `meta.spans` is empty); the last layer's output."""
        group = meta.decode
        b, d, hkv = x.shape[0], self.d, self.hkv
        if group is None or meta.spans or group.batch != b:
            raise ValueError("the fused decode layers need a decode-only step")
        step = (
            b,
            self.hidden,
            _dense(cos, "cos", (b, 1, d)),
            _dense(sin, "sin", (b, 1, d)),
            _index(group.row_ids, "rows", b),
            _index(group.kv, "kv", b * group.length),
            _index(group.lens, "lens", b),
            group.length,
            _index(meta.out_slots, "out_slots", b),
        )
        threads = torch.get_num_threads()
        x = x.contiguous()
        _dense(x, "x", (b, self.hidden))
        for layer in self._layers:
            k_buf, v_buf = pool.k_buffers[layer.index], pool.v_buffers[layer.index]
            slots = k_buf.shape[0]
            kp, vp = (
                _dense(k_buf, "k_buf", (slots, hkv, d)),
                _dense(v_buf, "v_buf", (slots, hkv, d)),
            )
            out = torch.empty_like(x)
            status = self._fn(
                x.data_ptr(), out.data_ptr(), b, self.hidden, *layer.norms, layer.eps,
                *layer.weights, self.inter, step[2], step[3], self.heads, hkv, d,
                kp, vp, slots, step[4], step[5], step[6], step[7], step[8],
                self.scale, threads,
            )  # fmt: skip
            if status:
                raise KernelError(f"fused decode layer {layer.index} failed (status {status})")
            x = out
        return x
