"""The decoder's shape, read from a Hugging Face ``config.json``.

One frozen dataclass describes every model the engine runs: Llama 2/3, SmolLM2, Mistral and Qwen2
are the same pre-norm decoder (RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP) and
differ only in the fields below.

Mistral's sliding window is honoured by capping the context at the window: a sequence that never
exceeds `sliding_window` tokens attends exactly as it would with the window, so `max_model_len`
(and `/v1/models`' context length) is the window for such checkpoints (Mistral 7B v0.1: 4,096).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """The checkpoint is not a decoder this engine can run; the message says what differs."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; ``rope_type`` picks how inverse frequencies are scaled."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {self.rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
            )
        if self.theta <= 0 or self.factor <= 0:
            raise UnsupportedModelError("rope theta and factor must be positive")


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model, the runner and the KV pool need to know about a decoder.

    Invariants (checked on construction): ``num_heads`` is a multiple of ``num_kv_heads``;
    ``head_dim`` is even (rotary pairs).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2; Llama's `attention_bias`
    o_bias: bool = False  # Llama's `attention_bias` also covers o_proj
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {self.model_type!r} is not supported; "
                f"supported Llama-architecture types: {SUPPORTED_MODEL_TYPES}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            if getattr(self, name) <= 0:
                raise UnsupportedModelError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim must be even for rotary, got {self.head_dim}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from the parsed ``config.json`` of a Hugging Face checkpoint."""
        model_type = cfg.get("model_type", "")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"hidden_act {cfg['hidden_act']!r}; only 'silu' is supported"
            )
        if model_type == "qwen2" and cfg.get("use_sliding_window", False):
            raise UnsupportedModelError("Qwen2 with use_sliding_window=true is not supported")
        context = int(cfg.get("max_position_embeddings", 2048))
        window = cfg.get("sliding_window") if model_type == "mistral" else None
        if isinstance(window, int) and 0 < window < context:
            # Mistral 7B v0.1 attends over the last `sliding_window` tokens only. Up to that many
            # tokens in all, windowed attention is full attention, so serving that context is
            # exact; beyond it the engine would be wrong, so it never goes there.
            context = window
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        head_dim = cfg.get("head_dim") or hidden // num_heads
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            max_position_embeddings=context,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_hf(cfg),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_as_id_tuple(cfg.get("eos_token_id")),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: a model folder needs a Hugging Face config.json"
            )
        return cls.from_hf_dict(json.loads(path.read_text()))


def _rope_from_hf(cfg: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (theta inside); older configs use
    # `rope_theta` + `rope_scaling`. Accept both.
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
