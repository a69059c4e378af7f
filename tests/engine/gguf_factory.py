"""Small random Llama GGUF files of one quantization type, for the quantized-path tests.

The metadata (tokenizer, chat template, rope, norms) is copied from the embedded SmolLM2 GGUF, the
shape keys are overridden, and every matmul tensor is random weights quantized to `qtype` (the
k-quants, which gguf cannot quantize, get random valid blocks), or to a type per tensor
(`q4_k_m`: Q4_K with Q6_K for attn_v, the first layer's ffn_down and an untied output.weight,
as llama.cpp's Q4_K_M recipe mixes them). The embedding is Q8_0 and tied unless an output type
is given; norms are F32. `arch` writes the same decoder as another architecture's GGUF (its own
key prefix): `qwen3` adds per-head Q/K norms; `gemma3` adds Q/K norms, norms after attention and
MLP, and a 4-token sliding window; `qwen3moe` adds Q/K norms and replaces each MLP by 8 experts
(top 2) of width 128, stacked `[E, out, in]`, and an F32 router; `phi3` fuses Q/K/V and gate/up,
rotates half of each head, and carries LongRoPE factor tensors (original context 4, so every
prompt of more than 4 tokens uses the long set). Added norms are random F32 around 1, so they
matter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

SHAPE_KEYS = {
    "llama.block_count": 2,
    "llama.embedding_length": 256,
    "llama.feed_forward_length": 512,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.rope.dimension_count": 64,
}


# transformers builds a Gemma tokenizer for a `gemma3` file and adds `<mask>` where the
# vocabulary lacks it; SmolLM2's lacks it, so the Gemma files get it as one more control token.
_GEMMA_MASK_TOKEN = {"tokenizer.ggml.tokens": "<mask>", "tokenizer.ggml.token_type": 3}


def random_blocks(qtype: QT, rows: int, cols: int, rng: np.random.Generator, std: float):
    """Valid blocks of `qtype` for a `[rows, cols]` weight of standard deviation ~`std`: gguf
    quantizes random weights where it can; the k-quants it cannot quantize (Q4_K, Q5_K, Q6_K)
    get random bytes with their block constants set to keep the weights ~`std`."""
    if qtype not in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        w = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        return quantize(w, qtype)
    size = GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)
    if qtype == QT.Q6_K:  # d * sc * q: q in -32..31 (std ~18), int8 sc (std ~73 if uniform)
        d = rng.uniform(0.5, 1.5, size=(rows, cols // 256, 1)) * std / (18 * 73)
        b[..., 208:210] = d.astype(np.float16).view(np.uint8)
        return b.reshape(rows, -1)
    # d * sc * q - dmin * m: 6-bit sc and m (0..63) times 4-bit (or 5-bit) values.
    levels = 63 if qtype == QT.Q4_K else 126
    consts = rng.uniform(0.2, 1.0, size=(rows, cols // 256, 2)) * std / levels * 2
    b[..., 0:4] = consts.astype(np.float16).view(np.uint8)
    return b.reshape(rows, -1)


def q4_k_m(layer: int, name: str) -> QT:
    """The type of `blk.{layer}.{name}.weight` (or `output`, layer -1) in a Q4_K_M-like file."""
    if name in ("attn_v", "output") or (name == "ffn_down" and layer == 0):
        return QT.Q6_K
    return QT.Q4_K


def write_random_llama_gguf(
    source: Path,
    out: Path,
    qtype: QT | Callable[[int, str], QT],
    seed: int = 0,
    arch: str = "llama",
) -> Path:
    """A 2-layer random Llama (or `arch`) GGUF with `source`'s tokenizer and `qtype` matmul
    weights (one type, or a function of (layer, tensor name) such as `q4_k_m`; its type for
    ("output", -1) makes the head untied)."""
    type_of = qtype if callable(qtype) else (lambda _layer, _name: qtype)
    head_type = type_of(-1, "output") if callable(qtype) else None
    reader = GGUFReader(source)
    writer = GGUFWriter(str(out), arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # written by the writer itself
        value = SHAPE_KEYS.get(key, f.contents())
        if arch == "gemma3" and key in _GEMMA_MASK_TOKEN:  # every Gemma vocabulary has it
            value = [*value, _GEMMA_MASK_TOKEN[key]]
        if arch == "gemma3" and key == "llama.vocab_size":
            value += 1
        if arch == "phi3" and key == "llama.rope.dimension_count":
            value = 32  # partial rotary: half of the 64-dim heads
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
        if key.startswith("llama."):
            key = arch + key.removeprefix("llama")
        writer.add_key_value(key, value, f.types[0], sub)
    if "llama.attention.key_length" not in reader.fields:
        writer.add_key_value(f"{arch}.attention.key_length", 64, GGUFValueType.UINT32)
    if arch == "gemma3":
        writer.add_key_value("gemma3.attention.sliding_window", 4, GGUFValueType.UINT32)
    experts = {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 128}
    for key, value in experts.items() if arch == "qwen3moe" else ():
        writer.add_key_value(f"qwen3moe.{key}", value, GGUFValueType.UINT32)
    if arch == "phi3":
        writer.add_key_value("phi3.rope.scaling.original_context_length", 4, GGUFValueType.UINT32)
        writer.add_key_value("phi3.rope.scaling.attn_factor", 1.3, GGUFValueType.FLOAT32)
    vocab = (
        int(reader.fields["llama.vocab_size"].contents())
        if "llama.vocab_size" in (reader.fields)
        else len(reader.fields["tokenizer.ggml.tokens"].contents())
    ) + (arch == "gemma3")
    hidden, inter = SHAPE_KEYS["llama.embedding_length"], SHAPE_KEYS["llama.feed_forward_length"]
    q_rows, kv_rows = 4 * 64, 2 * 64
    rng = np.random.default_rng(seed)
    writer.add_tensor("token_embd.weight", random_blocks(QT.Q8_0, vocab, hidden, rng, 0.5),
                      raw_dtype=QT.Q8_0)  # fmt: skip
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    if arch == "phi3":
        writer.add_tensor("rope_factors_long.weight", np.linspace(1, 8, 16, dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.linspace(1, 2, 16, dtype=np.float32))
    if head_type is not None:
        head = random_blocks(head_type, vocab, hidden, rng, hidden**-0.5 * 4)
        writer.add_tensor("output.weight", head, raw_dtype=head_type)
    shapes = {
        "attn_q": (q_rows, hidden), "attn_k": (kv_rows, hidden), "attn_v": (kv_rows, hidden),
        "attn_output": (hidden, q_rows), "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden),
        "ffn_down": (hidden, inter),
    }  # fmt: skip
    if arch == "phi3":
        shapes = {"attn_qkv": (q_rows + 2 * kv_rows, hidden), "attn_output": (hidden, q_rows),
                  "ffn_up": (2 * inter, hidden), "ffn_down": (hidden, inter)}  # fmt: skip
    for i in range(SHAPE_KEYS["llama.block_count"]):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        extra = {
            "qwen3": ("attn_q_norm", "attn_k_norm"),
            "qwen3moe": ("attn_q_norm", "attn_k_norm"),
            "gemma3": ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"),
        }
        for name in extra.get(arch, ()):
            size = 64 if name.startswith("attn_") else hidden
            norm = (1 + 0.3 * rng.standard_normal(size)).astype(np.float32)
            writer.add_tensor(f"blk.{i}.{name}.weight", norm)
        for name, (rows, cols) in shapes.items():
            if arch == "qwen3moe" and name.startswith("ffn_"):
                continue
            t = type_of(i, name)
            blocks = random_blocks(t, rows, cols, rng, cols**-0.5)
            writer.add_tensor(f"blk.{i}.{name}.weight", blocks, raw_dtype=t)
        if arch == "qwen3moe":
            n, width = experts["expert_count"], experts["expert_feed_forward_length"]
            router = (rng.standard_normal((n, hidden)) * hidden**-0.5 * 4).astype(np.float32)
            writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", router)
            for name, (rows, cols) in {"ffn_gate_exps": (width, hidden),
                                       "ffn_up_exps": (width, hidden),
                                       "ffn_down_exps": (hidden, width)}.items():  # fmt: skip
                t = type_of(i, name)
                blocks = np.stack([random_blocks(t, rows, cols, rng, cols**-0.5)
                                   for _ in range(n)])  # fmt: skip
                writer.add_tensor(f"blk.{i}.{name}.weight", blocks, raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
