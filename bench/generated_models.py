"""GGUF models the benches write themselves (random weights: no download), cached.

`qwen3-1b-q4_k_m`: a Qwen3-1.7B-shaped decoder cut to 20 layers (hidden 2048, FFN 6144, 16
heads, 8 KV heads of 128, per-head Q/K norms): 1.0 B parameters in its layers, 0.2 B more in an
untied embedding and head over the default model's tokenizer (49,152 tokens; its vocabulary,
merges, special tokens and chat template copied from the embedded SmolLM2 GGUF, so prompts
tokenize for real). Quantized as llama.cpp's Q4_K_M recipe does: Q4_K everywhere (the embedding
too), but Q6_K for the output head and for attn_v and ffn_down on the layers its `use_more_bits`
picks (the first and last eighth, and every third between: half of them). The blocks are random bytes with their block constants set for weights of
standard deviation ~1/sqrt(in_features) (quantizing a billion float weights in Python would take
many minutes; random valid blocks take seconds).

The file is written once into `<cache>/bench/` (`corral.base.paths.cache_root`, never the
repository), to a temp name and renamed; its name carries `VERSION`, bumped when the recipe
changes.

    python -m bench.generated_models qwen3-1b-q4_k_m      # prints the path, writing it if needed
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from corral.base.paths import cache_root

VERSION = 1
QWEN3_1B = {
    "block_count": 20,
    "context_length": 4096,
    "embedding_length": 2048,
    "feed_forward_length": 6144,
    "attention.head_count": 16,
    "attention.head_count_kv": 8,
    "attention.key_length": 128,
    "attention.value_length": 128,
    "rope.freq_base": 1_000_000.0,
    "attention.layer_norm_rms_epsilon": 1e-6,
}
_KEY_TYPES = {int: GGUFValueType.UINT32, float: GGUFValueType.FLOAT32}


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M choice of the layers whose attn_v and ffn_down get Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def random_blocks(qtype: QT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid Q4_K or Q6_K blocks (`uint8 [rows, row_bytes]`) of std ~1/sqrt(cols)."""
    size = GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.5, size=(rows, cols // 256, 1)) * cols**-0.5
    if qtype == QT.Q6_K:  # d * sc * q: q in -32..31, sc any int8
        b[..., 208:210] = (d / (18 * 73)).astype(np.float16).view(np.uint8)
    else:  # d * sc * q - dmin * m, sc and m in 0..63, q in 0..15: dmin = 7.5 d centres it
        d = d / 255
        b[..., 0:4] = np.concatenate((d, 7.5 * d), -1).astype(np.float16).view(np.uint8)
    return b.reshape(rows, -1)


def write_qwen3_1b(source: Path, out: Path, seed: int = 0) -> Path:
    """The `qwen3-1b-q4_k_m` model at `out`, with `source`'s tokenizer and chat template."""
    reader = GGUFReader(source)
    writer = GGUFWriter(str(out), "qwen3")
    for key, f in reader.fields.items():
        if key.startswith(("tokenizer.", "general.")) and key != "general.architecture":
            sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, f.contents(), f.types[0], sub)
    for key, value in QWEN3_1B.items():
        writer.add_key_value(f"qwen3.{key}", value, _KEY_TYPES[type(value)])
    c = QWEN3_1B
    hidden, inter, layers = c["embedding_length"], c["feed_forward_length"], c["block_count"]
    d, heads, kv = (
        c["attention.key_length"],
        c["attention.head_count"],
        c["attention.head_count_kv"],
    )
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    rng = np.random.default_rng(seed)
    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    writer.add_tensor("token_embd.weight", random_blocks(QT.Q4_K, vocab, hidden, rng),
                      raw_dtype=QT.Q4_K)  # fmt: skip
    writer.add_tensor("output_norm.weight", ones(hidden))
    writer.add_tensor("output.weight", random_blocks(QT.Q6_K, vocab, hidden, rng),
                      raw_dtype=QT.Q6_K)  # fmt: skip
    shapes = {
        "attn_q": (heads * d, hidden), "attn_k": (kv * d, hidden), "attn_v": (kv * d, hidden),
        "attn_output": (hidden, heads * d), "ffn_gate": (inter, hidden),
        "ffn_up": (inter, hidden), "ffn_down": (hidden, inter),
    }  # fmt: skip
    for i in range(layers):
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{name}.weight", ones(hidden))
        for name in ("attn_q_norm", "attn_k_norm"):
            writer.add_tensor(f"blk.{i}.{name}.weight", ones(d))
        for name, (rows, cols) in shapes.items():
            more = name in ("attn_v", "ffn_down") and use_more_bits(i, layers)
            qtype = QT.Q6_K if more else QT.Q4_K
            blocks = random_blocks(qtype, rows, cols, rng)
            writer.add_tensor(f"blk.{i}.{name}.weight", blocks, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


GENERATED = {"qwen3-1b-q4_k_m": write_qwen3_1b}


def generated_model(name: str, folder: Path | None = None) -> Path:
    """The path of generated model `name` (one of `GENERATED`), written on first use."""
    from corral.engine.loading.assets import default_gguf_path

    folder = folder or cache_root() / "bench"
    target = folder / f"{name}-v{VERSION}.gguf"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".gguf")
    os.close(fd)
    try:
        GENERATED[name](default_gguf_path(), Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(GENERATED):
        print(generated_model(arg))
