"""A GGUF's weights kept quantized: the CPU serving path (`--quantize gguf`, the default for a
`.gguf` on the CPU).

Every matmul weight whose GGUF type has an exact 4-bit mapping (Q4_0, Q4_1, Q4_K, Q8_0:
`engine.quant`) is packed for torch's int4 kernel straight from its raw blocks; Q6_K and Q5_K
(the second type of every Q4_K_M / Q5_K_M file) are kept as one byte a value with their own
scales for the `cpu_kquant` kernel (`KQuantWeight`) where that kernel runs. Fused Q/K/V and
gate/up are packed from the concatenated block rows (llama.cpp's Q/K row interleave undone on the
rows first). A tied embedding is packed as the LM head. The embedding table itself is not loaded:
`GGUFRows` reads the rows a step needs from the file, and the LM head's best 64 logits per row
are recomputed from them in float32 (`RefinedHead`). A fused weight whose parts have different
types (a Q4_K_M file's Q/K in Q4_K and V in Q6_K) keeps each run of one type packed in its own
kernel (`RowStack`). Anything else (norms, biases, an F16 matmul weight, one whose row count a
kernel cannot tile, a mixture-of-experts layer's experts) is dequantized to the model's dtype,
with one log line naming what stayed dense.

Memory: tensors are read from the file with plain reads into a buffer of their own, one at a
time, never through the memory map, so the process holds the packed model (about the file's size)
plus one tensor in flight, not the mapped file besides it.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from corral.engine.execution.model import DecoderLayer, DecoderModel
from corral.engine.execution.model_config import ModelConfig
from corral.engine.kernels.cpu_kquant import kquant_kernel
from corral.engine.kernels.quant import (
    KQUANT_TYPES,
    SUPPORTED_TYPES,
    Int4Weight,
    KQuantWeight,
    RowStack,
    int4_from_gguf,
    kquant_fits,
    kquant_from_gguf,
)
from corral.engine.loading.gguf_loader import (
    GGUF_NORM_OFFSET,
    PERMUTED_QK_ARCHS,
    ROPE_FACTOR_TENSORS,
    dequantize_array,
    hf_name,
    unpermute_qk,
)
from corral.engine.loading.weights import WeightLoadError

log = logging.getLogger(__name__)

_ROW_ALIGN = 16  # the int4 kernel tiles output rows by 16


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in a GGUF file, and how its rows are stored."""

    name: str  # the GGUF name (`blk.0.attn_q.weight`)
    qtype: QT
    shape: tuple[int, ...]  # Hugging Face order: `[out_features, in_features]`
    offset: int  # absolute, in bytes
    row_bytes: int  # bytes of one row (of the last axis); 1-D tensors are one row

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def stored(self) -> tuple[np.dtype, tuple[int, ...]]:
        """numpy dtype and shape of the stored bytes/values (as `ReaderTensor.data`)."""
        if self.qtype in _PLAIN:
            return np.dtype(_PLAIN[self.qtype]), self.shape
        return np.dtype(np.uint8), (*self.shape[:-1], self.row_bytes)


_PLAIN = {QT.F32: np.float32, QT.F16: np.float16}  # other types are stored as raw bytes


def gguf_index(path: str | Path) -> dict[str, TensorInfo]:
    """Every tensor of a GGUF file by name, from its header alone.

    `gguf.GGUFReader` materialises every metadata value (a tokenizer's vocabulary is hundreds of
    thousands of small arrays: ~150 MB and ~3 s for SmolLM2's); this reads the header once and
    skips the values, so indexing costs a few milliseconds and no memory.
    """
    with open(path, "rb") as f:
        magic, version = f.read(4), _u(f, "<I")
        if magic != b"GGUF" or version not in (2, 3):
            raise WeightLoadError(f"{path}: not a GGUF v2/v3 file")
        n_tensors, n_kv = _u(f, "<Q"), _u(f, "<Q")
        alignment = 32
        for _ in range(n_kv):
            key = _string(f)
            vtype = _u(f, "<I")
            if key == "general.alignment":
                alignment = _value(f, vtype)
            else:
                _skip(f, vtype)
        infos = []
        for _ in range(n_tensors):
            name = _string(f)
            dims = [_u(f, "<Q") for _ in range(_u(f, "<I"))]
            qtype, offset = QT(_u(f, "<I")), _u(f, "<Q")
            infos.append((name, dims, qtype, offset))
        start = -(-f.tell() // alignment) * alignment
    out = {}
    for name, dims, qtype, offset in infos:
        block, size = GGML_QUANT_SIZES[qtype]
        out[name] = TensorInfo(name, qtype, tuple(reversed(dims)), start + offset,
                               dims[0] // block * size)  # fmt: skip
    return out


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


def _u(f, fmt: str):
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _string(f) -> str:
    return f.read(_u(f, "<Q")).decode("utf-8", errors="replace")


def _value(f, vtype: int):
    return _string(f) if vtype == _STRING else _u(f, _SCALARS[vtype])


def _skip(f, vtype: int) -> None:
    if vtype == _STRING:
        f.seek(_u(f, "<Q"), os.SEEK_CUR)
    elif vtype == _ARRAY:
        itype, count = _u(f, "<I"), _u(f, "<Q")
        if itype in _SCALARS:
            f.seek(count * struct.calcsize(_SCALARS[itype]), os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip(f, itype)
    elif vtype in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[vtype]), os.SEEK_CUR)
    else:
        raise WeightLoadError(f"unknown GGUF metadata type {vtype}")


class _GGUFTensors:
    """The file's tensors by Hugging Face name, read one at a time with plain file reads."""

    def __init__(self, path: Path, config: ModelConfig) -> None:
        self.path = path
        self.by_name = {
            hf_name(n, config.model_type): t
            for n, t in gguf_index(path).items()
            if n not in ROPE_FACTOR_TENSORS
        }  # read into the config; fmt: skip
        self.permuted = config.model_type in PERMUTED_QK_ARCHS
        self.heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}
        self.used: set[str] = set()
        self.dense: Counter[str] = Counter()
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()

    def close(self) -> None:
        self._file.close()

    def qtype(self, name: str) -> QT:
        return self.info(name).qtype

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes/values in Hugging Face row order (rows un-interleaved)."""
        t = self.info(name)
        self.used.add(name)
        dtype, shape = t.stored
        buf = np.empty(shape, dtype=dtype)
        self._file.seek(t.offset)
        if self._file.readinto(memoryview(buf).cast("B")) != buf.nbytes:
            raise WeightLoadError(f"{self.path}: tensor {t.name} is cut short")
        proj = name.split(".")[-2]
        if self.permuted and proj in self.heads:
            buf = unpermute_qk(buf, self.heads[proj])
        return buf

    def dequantized(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        t = self.info(name)
        return dequantize_array(self.raw(name), t.qtype, t.shape, dtype)

    def rows(self, name: str) -> GGUFRows:
        """The tensor as a table read row by row from the file (`GGUFRows`)."""
        self.used.add(name)
        return GGUFRows(self.path, self.info(name))

    def info(self, name: str) -> TensorInfo:
        if name not in self.by_name:
            raise WeightLoadError(f"{self.path}: missing tensor {name!r} (Hugging Face name)")
        return self.by_name[name]


class GGUFRows:
    """A GGUF embedding table read row by row from the file when tokens are looked up: rows are
    dequantized on the way (any GGUF type, exact). The table is a read-only memory map, so it
    takes no anonymous memory: the rows a step reads are page-cache pages the kernel may drop,
    and a lookup makes no system call once they are mapped (the refined head reads 64 rows a
    decode step)."""

    def __init__(self, path: Path, tensor: TensorInfo) -> None:
        self.info = tensor
        self.shape = tensor.shape
        self._rows = np.memmap(
            path, np.uint8, "r", offset=tensor.offset, shape=(self.shape[0], tensor.row_bytes)
        )

    def lookup(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """`[len(ids), hidden]` rows in `dtype`."""
        t, wanted = self.info, ids.tolist()
        if not wanted:
            return torch.empty(0, self.shape[1], dtype=dtype)
        raw = self._rows[wanted]  # a copy of just those rows
        if t.qtype == QT.Q8_0:
            return _q8_0_rows(torch.from_numpy(raw), self.shape[1]).to(dtype)
        stored_dtype, stored_shape = t.stored
        blocks = raw.view(stored_dtype).reshape(len(wanted), *stored_shape[1:])
        return dequantize_array(blocks, t.qtype, (len(wanted), self.shape[1]), dtype)


def _q8_0_rows(raw: torch.Tensor, hidden: int) -> torch.Tensor:
    """Q8_0 rows (`uint8 [n, row_bytes]`: per 32 values an fp16 scale, then 32 int8) in float32,
    as gguf's reference computes them (`scale * q` in float32), with a few torch ops instead of
    its generic numpy path (a decode step's 64 head rows: ~4x faster)."""
    blocks = raw.view(raw.shape[0], -1, 34)
    scale = blocks[..., :2].contiguous().view(torch.float16).float()
    q = blocks[..., 2:].contiguous().view(torch.int8).float()
    return (q * scale).reshape(raw.shape[0], hidden)


@dataclass(frozen=True, eq=False)
class RefinedHead:
    """The LM head kept quantized (int4 or kquant kernel), whose best `top` logits per row are recomputed in
    float32 from the head's exact rows (read from the file, `GGUFRows`).

    The kernel writes its output in bfloat16: logits of ~20 come out in steps of 0.125, so the
    leading tokens often tie exactly, and greedy decoding, top-k, min-p and logprobs would see
    ties the model does not have. Recomputing the leaders exactly (a few hundred dot products a
    step) removes them; the tail keeps the kernel's rounding, which moves no decision.
    """

    weight: Int4Weight | KQuantWeight
    rows: GGUFRows
    top: int = 64

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape

    def linear(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """`x @ self.T (+ b)`: `refined_head_linear` (`quant.any_linear` calls it)."""
        return refined_head_linear(x, self, b)


def refined_head_linear(x: torch.Tensor, head: RefinedHead, b: torch.Tensor | None):
    """`x @ head.T (+ b)` in float32: the kernel's logits, the leaders' recomputed exactly.

    The result is float32 whatever `x`'s dtype: written back into a bfloat16 tensor, the exact
    leaders would be rounded to the kernel's steps again and tie as before."""
    y = head.weight.linear(x, None).float()
    if y.shape[0] == 0:  # a prefill chunk that samples no row
        return y if b is None else y.add_(b)
    ids = y.topk(min(head.top, y.shape[1]), dim=-1).indices  # [rows, top]
    w = head.rows.lookup(ids.reshape(-1), torch.float32).view(*ids.shape, -1)
    exact = torch.bmm(w, x.float().unsqueeze(2)).squeeze(2)
    y.scatter_(1, ids, exact)
    return y if b is None else y.add_(b)


def load_gguf_quantized(path: str | Path, config: ModelConfig, dtype: torch.dtype) -> DecoderModel:
    """A CPU `DecoderModel` whose matmuls run on the GGUF's own quantized weights."""
    src = _GGUFTensors(Path(path), config)
    try:
        model = DecoderModel(config, dtype, "cpu", dense_matmuls=False)
        with torch.no_grad():
            _fill(model, src, config, dtype)
        unused = set(src.by_name) - src.used
        if unused - {"lm_head.weight"}:
            raise WeightLoadError(
                f"{path}: tensors this decoder does not use: {sorted(unused)[:5]}"
            )
    finally:
        src.close()
    _return_freed_memory()
    if src.dense:
        log.info(
            "%s: kept %d matmul tensors quantized; dequantized to %s: %s",
            Path(path).name,
            _count_quantized(model),
            str(dtype).removeprefix("torch."),
            ", ".join(f"{n} x{k}" for k, n in sorted(src.dense.items())),
        )
    return model


def _norm(src: _GGUFTensors, name: str, c: ModelConfig, dtype: torch.dtype) -> torch.Tensor:
    """A norm weight as the model holds it (`norm_offset` folded in, as the GGUF has it)."""
    if c.norm_offset != GGUF_NORM_OFFSET.get(c.model_type, 0.0):
        raise WeightLoadError(f"{c.model_type}: GGUF norms without the model's norm offset")
    return src.dequantized(name, dtype)


def _fill(model: DecoderModel, src: _GGUFTensors, c: ModelConfig, dtype: torch.dtype) -> None:
    model.norm.copy_(_norm(src, "model.norm.weight", c, dtype))
    embed = src.rows("model.embed_tokens.weight")
    model.set_embedding(embed)
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    weight = _matmul(src, (head,), dtype)
    if isinstance(
        weight, (Int4Weight, KQuantWeight)
    ):  # a tied head's exact rows are the embedding's
        weight = RefinedHead(weight, embed if c.tie_word_embeddings else src.rows(head))
    model.set_lm_head(weight)
    for i, layer in enumerate(model.layers):
        _fill_layer(layer, f"model.layers.{i}.", src, c, dtype)


def _fill_layer(
    layer: DecoderLayer, prefix: str, src: _GGUFTensors, c: ModelConfig, dtype: torch.dtype
) -> None:
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    if layer.moe is not None:  # the experts stay dense (dequantized to `dtype`)
        moe, experts = layer.moe, mlp + "experts."
        moe.router.copy_(src.dequantized(mlp + "gate.weight", dtype))
        gate, up = (
            src.dequantized(f"{experts}{p}.weight", dtype) for p in ("gate_proj", "up_proj")
        )
        moe.gate_up.copy_(torch.cat((gate, up), dim=1))
        moe.down.copy_(src.dequantized(experts + "down_proj.weight", dtype))
        src.dense.update(src.qtype(f"{experts}{p}.weight").name + " (experts)"
                         for p in ("gate_proj", "up_proj", "down_proj"))  # fmt: skip
    norms = {"input_norm": "input_layernorm", "post_norm": "post_attention_layernorm"}
    if c.sandwich_norms:  # Gemma 3 (as in `weights._fill_layer`)
        norms.update(attn_out_norm="post_attention_layernorm",
                     post_norm="pre_feedforward_layernorm",
                     mlp_out_norm="post_feedforward_layernorm")  # fmt: skip
    if c.qk_norm:  # Qwen3, Gemma 3
        norms.update(q_norm="self_attn.q_norm", k_norm="self_attn.k_norm")
    for param, name in norms.items():
        # A Gemma GGUF's norms already carry the model's `(1 + w)` offset.
        getattr(layer, param).copy_(_norm(src, f"{prefix}{name}.weight", c, dtype))
    qkv = tuple(f"{attn}{p}.weight" for p in ("q_proj", "k_proj", "v_proj"))
    if attn + "qkv_proj.weight" in src.by_name:  # Phi-3: fused in the file already
        qkv = (attn + "qkv_proj.weight",)
    layer.set_matmul_weight("qkv_weight", _matmul(src, qkv, dtype))
    layer.set_matmul_weight("o_weight", _matmul(src, (attn + "o_proj.weight",), dtype))
    if layer.moe is None:
        gate_up = (mlp + "gate_proj.weight", mlp + "up_proj.weight")
        if mlp + "gate_up_proj.weight" in src.by_name:  # Phi-3
            gate_up = (mlp + "gate_up_proj.weight",)
        layer.set_matmul_weight("gate_up_weight", _matmul(src, gate_up, dtype))
        layer.set_matmul_weight("down_weight", _matmul(src, (mlp + "down_proj.weight",), dtype))
    if c.qkv_bias:
        bias = torch.cat([src.dequantized(n.replace(".weight", ".bias"), dtype) for n in qkv])
        layer.qkv_bias.copy_(bias)


def _matmul(
    src: _GGUFTensors, names: tuple[str, ...], dtype: torch.dtype
) -> Int4Weight | KQuantWeight | RowStack | torch.Tensor:
    """One (fused) matmul weight: packed from the block rows when every part has the same
    supported type and the rows tile; parts of different types (a Q4_K_M file's Q/K and V) each
    packed in its own type (`RowStack`, runs of one type packed together); else dequantized."""
    runs = [list(g) for _, g in itertools.groupby(names, key=src.qtype)]
    if all(_packs(src, run) for run in runs):
        parts = [_quantized_run(src, run) for run in runs]
        return parts[0] if len(parts) == 1 else RowStack(tuple(parts))
    src.dense.update(src.qtype(n).name for n in names)
    return torch.cat([src.dequantized(n, dtype) for n in names])


def _packs(src: _GGUFTensors, names: list[str]) -> bool:
    """Whether the parts `names` (of one type) pack into one quantized weight."""
    qtype, n = src.qtype(names[0]), sum(src.info(name).shape[0] for name in names)
    if qtype in SUPPORTED_TYPES:
        return n % _ROW_ALIGN == 0
    k = src.info(names[0]).shape[-1]
    return qtype in KQUANT_TYPES and kquant_fits(n, k) and kquant_kernel() is not None


def _quantized_run(src: _GGUFTensors, names: list[str]) -> Int4Weight | KQuantWeight:
    qtype = src.qtype(names[0])
    rows = [src.raw(name) for name in names]
    blocks = np.concatenate(rows) if len(rows) > 1 else rows[0]
    return (
        int4_from_gguf(blocks, qtype)
        if qtype in SUPPORTED_TYPES
        else kquant_from_gguf(blocks, qtype)
    )


def _count_quantized(model: DecoderModel) -> int:
    weights = [getattr(layer, n) for layer in model.layers for n in layer.matmul_names]
    return sum(not isinstance(w, torch.Tensor) for w in [*weights, model.lm_head])


def _return_freed_memory() -> None:
    """Hand the unpacking's freed heap back to the system (glibc keeps it otherwise; ~15% of a
    small model's size)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do
