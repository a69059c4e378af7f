"""Turn a llama.cpp GGUF file into a Hugging Face folder, once.

The engine has one loader, for Hugging Face folders. A GGUF file (the embedded default model is
one) is dequantized, one tensor at a time, straight to the served dtype (float32 on the CPU by
default, bfloat16 on CUDA) and written out as `config.json`, `generation_config.json`,
`model.safetensors` and the tokenizer files (with the chat template), after which it loads like any
other checkpoint. Memory holds one dequantized tensor at a time, never the model. Weights are read with the `gguf` package; transformers only builds the tokenizer.

llama.cpp stores Llama's Q and K projection rows interleaved for its rotary kernel (pairs
`(i, i + d/2)` of each head become neighbours); `unpermute_qk` restores Hugging Face's half-split
layout. Qwen2, Qwen3 and Gemma 3 GGUFs are not permuted. Qwen3 and Gemma 3 add
per-head Q/K norms (`blk.N.attn_q_norm.weight`, `attn_k_norm`); Gemma 3 norms the attention and
MLP outputs too (`post_attention_norm`, `post_ffw_norm`; its `ffn_norm` is the pre-MLP norm) and
stores its norm weights with the `1 + w` offset folded in (taken out again here). What llama.cpp
fixes in code instead of the file (Gemma 3's global every 6th layer and local rope base) is
written into the config as llama.cpp assumes it. Qwen3-MoE stores each layer's experts stacked
(`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`: `[experts, out, in]`) beside the router
(`ffn_gate_inp`); gate and up are written as one `gate_up_proj` per layer. Phi-3 stores Q/K/V and
gate/up fused (`attn_qkv`, `ffn_up`), partial rotary as `rope.dimension_count`, and LongRoPE's two
factor sets as the tensors `rope_factors_long`/`rope_factors_short`, read into the config.
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

# SmolLM3 is not among them: transformers cannot build its tokenizer from a GGUF.
SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3")
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
PERMUTED_QK_ARCHS = ("llama",)  # convert_hf_to_gguf's Llama path interleaves Q/K rows
# llama.cpp fixes these rather than storing them: Gemma 3's sliding layers use base 10,000 and
# every 6th layer is global.
_GEMMA3_LOCAL_BASE, _GEMMA3_PATTERN = 10000.0, 6

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
    "attn_q_norm": "self_attn.q_norm",  # Qwen3, Gemma 3
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",  # Gemma 3 (its ffn_norm: see below)
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate_inp": "mlp.gate",  # Qwen3-MoE: the router, and the experts stacked [E, out, in]
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj",  # Phi-3: fused (and its `ffn_up` is gate and up fused)
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
    rotary = int(a("rope.dimension_count", head_dim))
    if rotary != head_dim and arch != "phi3":
        raise UnsupportedModelError(f"partial rotary embeddings are not supported for {arch}")
    vocab = a("vocab_size") or len(field(reader, "tokenizer.ggml.tokens", []))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(a("rope.freq_base", 1e4))}
    scaling = a("rope.scaling.type", "none")
    if scaling == "linear":
        rope.update(rope_type="linear", factor=float(a("rope.scaling.factor")))
    elif scaling != "none":
        raise UnsupportedModelError(f"GGUF rope scaling {scaling!r} is not supported")
    if ROPE_FACTOR_TENSORS[0] in names:  # Phi-3 LongRoPE: the factor sets are tensors
        factors = {t.name: [float(x) for x in t.data] for t in reader.tensors
                   if t.name in ROPE_FACTOR_TENSORS}  # fmt: skip
        rope.update(
            rope_type="longrope",
            long_factor=factors[ROPE_FACTOR_TENSORS[0]],
            short_factor=factors[ROPE_FACTOR_TENSORS[1]],
            original_max_position_embeddings=int(a("rope.scaling.original_context_length")),
            attention_factor=float(a("rope.scaling.attn_factor", 1.0)),
        )
    config = {
        "architectures": [_HF_ARCHITECTURES[arch]],
        "model_type": {"gemma3": "gemma3_text", "qwen3moe": "qwen3_moe"}.get(arch, arch),
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(a("feed_forward_length") or a("expert_feed_forward_length")),
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
    if arch == "phi3":
        config["rope_parameters"]["partial_rotary_factor"] = rotary / head_dim
        if rope["rope_type"] == "longrope":  # Phi3Config reads the top-level field
            config["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
        config["sliding_window"] = a("attention.sliding_window")
    if arch == "qwen3moe":  # llama.cpp: every layer routed, the top-k weights renormalised
        config.update(
            num_experts=int(a("expert_count")),
            num_experts_per_tok=int(a("expert_used_count")),
            moe_intermediate_size=int(a("expert_feed_forward_length")),
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if arch == "gemma3":
        layers = config["num_hidden_layers"]
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=int(a("attention.sliding_window")),
            layer_types=[
                "sliding_attention" if (i + 1) % _GEMMA3_PATTERN else "full_attention"
                for i in range(layers)
            ],  # fmt: skip
            rope_local_base_freq=_GEMMA3_LOCAL_BASE,
            # as llama.cpp: 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(hidden/heads)
            query_pre_attn_scalar=hidden // heads if layers == 62 else head_dim,
            final_logit_softcapping=a("final_logit_softcapping"),
            attn_logit_softcapping=a("attn_logit_softcapping"),
        )
        rope = config.pop("rope_parameters")
        config["rope_theta"] = rope.pop("rope_theta")
        config["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    return config


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """Hugging Face tensor name of a GGUF tensor name (`blk.3.attn_q.weight` -> ...q_proj.weight)
    for a file of architecture `arch` (Gemma 3's `ffn_norm` is its pre-feedforward norm)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        name = _LAYER_NAMES[parts[2]]
        if arch in ("gemma3", "gemma3_text") and parts[2] == "ffn_norm":
            name = "pre_feedforward_layernorm"
        if arch == "phi3" and parts[2] == "ffn_up":
            name = "mlp.gate_up_proj"
        return f"model.layers.{parts[1]}.{name}.{parts[3]}"
    raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name!r} for a Llama-style decoder")


# Phi-3's LongRoPE factor sets (long, short): metadata stored as tensors, not model weights.
ROPE_FACTOR_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


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
    if config["model_type"] in PERMUTED_QK_ARCHS and proj in heads:
        data = unpermute_qk(data, heads[proj])  # whole rows move: blocks along K stay intact
    out = dequantize_array(data, t.tensor_type, shape, dtype)
    if config["model_type"] == "gemma3_text" and name.endswith("norm.weight"):
        out = out - GGUF_NORM_OFFSET["gemma3_text"]  # back to Hugging Face's `w` of `(1 + w)`
    return out


# llama.cpp's converter stores Gemma's norm weights as `1 + w` (its RMSNorm multiplies by the
# weight as is); the Hugging Face layout keeps `w`.
GGUF_NORM_OFFSET = {"gemma3_text": 1.0}


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
        arch = config["model_type"]
        tensors = {
            hf_name(t.name, arch): t for t in reader.tensors if t.name not in ROPE_FACTOR_TENSORS
        }  # in file order; fmt: skip
        entries = [(n, tuple(int(d) for d in reversed(t.shape))) for n, t in tensors.items()]
        entries = _stacked_experts(entries)
        write_safetensors_streaming(
            out_dir / "model.safetensors",
            entries,
            lambda name: _produce(tensors, name, config, dtype),
            dtype,
        )
    _write_tokenizer(reader, gguf_path, out_dir, config)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


_GATE, _UP, _GATE_UP = "mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.gate_up_proj"


def _stacked_experts(entries: list[tuple[str, tuple[int, ...]]]):
    """A MoE layer's gate and up experts (`[E, I, H]` each) as one `gate_up_proj` `[E, 2I, H]`,
    the stacked layout the weight loader (and transformers >= 5) reads."""
    out = []
    for name, shape in entries:
        if _UP in name:
            continue
        if _GATE in name:
            name = name.replace(_GATE, _GATE_UP).removesuffix(".weight")
            shape = (shape[0], 2 * shape[1], shape[2])
        elif "mlp.experts.down_proj" in name:
            name = name.removesuffix(".weight")
        out.append((name, shape))
    return out


def _produce(tensors: dict[str, Any], name: str, config: dict[str, Any], dtype: torch.dtype):
    if _GATE_UP in name:
        gate, up = (name.replace(_GATE_UP, part) + ".weight" for part in (_GATE, _UP))
        parts = (dequantized(tensors[n], n, config, dtype) for n in (gate, up))
        return torch.cat(tuple(parts), dim=1)
    if name.endswith("mlp.experts.down_proj"):
        name += ".weight"
    return dequantized(tensors[name], name, config, dtype)


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
