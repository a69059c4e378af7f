"""Turn a llama.cpp GGUF file into a Hugging Face folder, once.

The engine has one loader, for Hugging Face folders. A GGUF file (the embedded default model is
one) is dequantized to float32 and written out as `config.json`, `generation_config.json`,
`model.safetensors` and the tokenizer files (with the chat template), after which it loads like any
other checkpoint. Weights are read with the `gguf` package; transformers only builds the tokenizer.

llama.cpp stores Llama's Q and K projection rows interleaved for its rotary kernel (pairs
`(i, i + d/2)` of each head become neighbours); `unpermute_qk` restores Hugging Face's half-split
layout. Qwen2 GGUFs are not permuted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file

from corral.engine.model_config import UnsupportedModelError

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2")

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
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
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


def read_gguf_tensors(reader: GGUFReader, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to float32, under its Hugging Face name and layout."""
    permuted = config["model_type"] == "llama"
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest axis first
        arr = dequantize(t.data, t.tensor_type).reshape(shape)
        proj = name.split(".")[-2]
        if permuted and proj in heads:
            arr = unpermute_qk(arr, heads[proj])
        # Copy: F32 tensors are views of the read-only memory map.
        out[name] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C"))
    return out


def convert_gguf_to_hf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Write a complete Hugging Face folder for `gguf_path` into `out_dir` (created if needed).

    Not atomic by itself; `assets.ensure_converted` writes into a temporary folder and renames.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(gguf_path)
    config = hf_config_from_gguf(reader)
    tensors = read_gguf_tensors(reader, config)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
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
