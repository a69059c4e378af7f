"""Turn a llama.cpp GGUF file into a Hugging Face folder, once.

The engine has one loader, for Hugging Face folders. A GGUF file (the embedded default model is
one) is dequantized, one tensor at a time, straight to the served dtype (float32 on the CPU by
default, bfloat16 on CUDA) and written out as `config.json`, `generation_config.json`,
`model.safetensors` and the tokenizer files (with the chat template), after which it loads like any
other checkpoint. Memory holds one dequantized tensor at a time, never the model. Weights are read with the `gguf` package; transformers only builds the tokenizer.

llama.cpp stores Llama's Q and K projection rows interleaved for its rotary kernel (pairs
`(i, i + d/2)` of each head become neighbours); `unpermute_qk` restores Hugging Face's half-split
layout. Qwen2 and Qwen3 GGUFs are not permuted. Qwen3 adds per-head Q/K norms
(`blk.N.attn_q_norm.weight`, `attn_k_norm`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from corral.engine.execution.model_config import UnsupportedModelError

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "qwen3")
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3
    "attn_k_norm": "self_attn.k_norm",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value (str, number or list), or `default` when the key is absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_config_from_gguf(reader: GGUFReader) -> dict[str, Any]:
    """The Hugging Face `config.json` equivalent of the GGUF metadata."""
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported; supported: {SUPPORTED_GGUF_ARCHS}"
        )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(
            "this GGUF carries rope_freqs (Llama 3.1 rope scaling baked into a tensor); "
            "load the Hugging Face folder of the model instead"
        )

    def a(key: str, default: Any = None) -> Any:
        return field(reader, f"{arch}.{key}", default)

    heads = int(a("attention.head_count"))
    hidden = int(a("embedding_length"))
    head_dim = int(a("attention.key_length", hidden // heads))
    if int(a("rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedModelError("partial rotary embeddings are not supported")
    vocab = a("vocab_size") or len(field(reader, "tokenizer.ggml.tokens", []))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(a("rope.freq_base", 1e4))}
    scaling = a("rope.scaling.type", "none")
    if scaling == "linear":
        rope.update(rope_type="linear", factor=float(a("rope.scaling.factor")))
    elif scaling != "none":
        raise UnsupportedModelError(f"GGUF rope scaling {scaling!r} is not supported")
    return {
        "architectures": [_HF_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(a("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(a("context_length")),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_parameters": rope,
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": False,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


def hf_name(gguf_name: str) -> str:
    """Hugging Face tensor name of a GGUF tensor name (`blk.3.attn_q.weight` -> ...q_proj.weight)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name!r} for a Llama-style decoder")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row interleaving of a Q or K projection (weight or bias)."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantized(t: Any, name: str, config: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
    """One GGUF tensor dequantized, in Hugging Face layout, cast to `dtype`."""
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest axis first
    proj = name.split(".")[-2]
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    data = t.data
    if config["model_type"] == "llama" and proj in heads:
        data = unpermute_qk(data, heads[proj])  # whole rows move: blocks along K stay intact
    return dequantize_array(data, t.tensor_type, shape, dtype)


def dequantize_array(data: np.ndarray, qtype: Any, shape: tuple[int, ...], dtype: torch.dtype):
    """A tensor's stored rows (`ReaderTensor.data` layout) dequantized to `dtype` `shape`."""
    arr = dequantize(data, qtype).reshape(shape)
    # Copy: F32 tensors are views of the read-only memory map.
    return torch.from_numpy(np.array(arr, dtype=np.float32, order="C")).to(dtype)


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors_streaming(
    path: Path,
    entries: list[tuple[str, tuple[int, ...]]],
    produce: Callable[[str], torch.Tensor],
    dtype: torch.dtype,
) -> None:
    """A safetensors file of `entries` (name, shape), each tensor made by `produce(name)` only when
    its turn comes: memory holds one tensor at a time, not the model. The header comes first
    (offsets follow from the shapes), as the format requires."""
    elem = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in entries:
        size = elem * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in entries:
            t = produce(name)
            if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                raise ValueError(f"{name}: made {tuple(t.shape)} {t.dtype}, declared {shape}")
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def convert_gguf_to_hf(
    gguf_path: str | Path,
    out_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    weights: bool = True,
) -> None:
    """Write a complete Hugging Face folder for `gguf_path` into `out_dir` (created if needed),
    its weights dequantized tensor by tensor straight to `dtype` (float32, bfloat16, float16);
    `weights=False` writes the config and tokenizer only (the quantized path reads the weights
    from the GGUF itself, `engine.gguf_weights`).

    Not atomic by itself; `assets.ensure_converted` writes into a temporary folder and renames.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(gguf_path)
    config = hf_config_from_gguf(reader)
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    if weights:
        tensors = {hf_name(t.name): t for t in reader.tensors}  # in file order
        entries = [(n, tuple(int(d) for d in reversed(t.shape))) for n, t in tensors.items()]
        write_safetensors_streaming(
            out_dir / "model.safetensors",
            entries,
            lambda name: dequantized(tensors[name], name, config, dtype),
            dtype,
        )
    _write_tokenizer(reader, gguf_path, out_dir, config)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _write_tokenizer(
    reader: GGUFReader, gguf_path: Path, out_dir: Path, config: dict[str, Any]
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    template = field(reader, "tokenizer.chat_template")
    if template and not tok.chat_template:
        tok.chat_template = template
    if len(tok) > config["vocab_size"]:
        raise UnsupportedModelError(
            f"tokenizer has {len(tok)} tokens but the model only {config['vocab_size']} logits"
        )
    tok.save_pretrained(str(out_dir))
