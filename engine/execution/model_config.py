"""The decoder's shape, read from a Hugging Face ``config.json``.

One frozen dataclass describes every model the engine runs. They are all one pre-norm decoder
(RMSNorm, rotary attention with grouped KV heads, a gated MLP) and differ only in the fields below:

- Llama 2/3, SmolLM2, Mistral, Qwen2: the plain decoder (Qwen2: Q/K/V biases).
- Qwen3: RMSNorm over each head's Q and K before RoPE (`qk_norm`), an explicit `head_dim`.
- SmolLM3: some layers without RoPE (`layer_rope`, from `no_rope_layers`).
- Qwen3-MoE: a routed mixture of SwiGLU experts in place of the MLP (`moe`, `engine.execution.moe`).
- Gemma 3: `(1 + w)` norms (`norm_offset`, folded into the weights at load time), norms after
  attention and MLP too (`sandwich_norms`), GeGLU, a scaled embedding, interleaved sliding-window
  and global layers with their own rope bases (`layer_windows`, `layer_rope`, `local_rope`), the
  attention scale from `query_pre_attn_scalar`, optional final logit soft-capping.
- Phi-3 / Phi-4-mini: fused `qkv_proj`/`gate_up_proj` checkpoint tensors (the loader splits
  nothing: they are the engine's own fused layout), partial rotary (`rotary_dim`), LongRoPE, a
  sliding window on every layer where `sliding_window` is shorter than the context.

Rope scaling (`RopeConfig.rope_type`): linear, llama3, yarn, longrope. LongRoPE has two factor
sets; transformers picks the long one for a whole forward pass whose sequence exceeds
`original_max_position_embeddings`, so a cached sequence that crosses the threshold would mix the
two. The engine picks once per model instead: the long factors when the served context
(`max_position_embeddings`) exceeds the original one (Phi-4-mini: 131,072 > 4,096), else the short
ones. Up to the original length this differs from transformers, which uses the short set there.

Sliding windows are enforced by the attention backends (`layer_windows`: each layer's window or
None). Mistral's window is instead honoured by capping the context at the window: a sequence that
never exceeds `sliding_window` tokens attends exactly as it would with the window, so
`max_model_len` (and `/v1/models`' context length) is the window for such checkpoints (Mistral 7B
v0.1: 4,096).

Anything else (another `model_type`, activation, rope type, attention soft-capping) is refused at
startup with an `UnsupportedModelError` naming the field and value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "qwen3_moe",
                         "gemma3_text", "gemma3", "phi3")  # fmt: skip
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


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
    original_max_position_embeddings: int = 8192  # llama3, yarn, longrope
    beta_fast: float = 32.0  # yarn only
    beta_slow: float = 1.0  # yarn only
    truncate: bool = True  # yarn only
    attention_factor: float = 1.0  # yarn, longrope: multiplies the cos/sin tables
    ext_factors: tuple[float, ...] = ()  # longrope: the chosen (short or long) factor set

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {self.rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
            )
        if self.theta <= 0 or self.factor <= 0:
            raise UnsupportedModelError("rope theta and factor must be positive")


@dataclass(frozen=True)
class MoEConfig:
    """A routed mixture of SwiGLU experts (Qwen3-MoE): each token goes to its `top_k` experts."""

    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP (False)

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts or self.intermediate_size <= 0:
            raise UnsupportedModelError(
                f"num_experts_per_tok ({self.top_k}) must be in 1..num_experts "
                f"({self.num_experts}), moe_intermediate_size positive"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model, the runner and the KV pool need to know about a decoder.

    Invariants (checked on construction): ``num_heads`` is a multiple of ``num_kv_heads``;
    ``rotary_dim`` is even and at most ``head_dim``; the per-layer tuples are empty or have one
    entry per layer.
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
    hidden_act: str = "silu"  # the MLP's gate activation: silu (SwiGLU) or gelu tanh (GeGLU)
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head's Q and K before RoPE
    sandwich_norms: bool = False  # Gemma 3: norms on the attention and MLP outputs too
    norm_offset: float = 0.0  # Gemma: norms scale by (offset + w); added to w at load time
    embed_scale: float = 1.0  # Gemma: the embedding is multiplied by sqrt(hidden_size)
    query_pre_attn_scalar: float | None = None  # Gemma: attention scale 1/sqrt(this)
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    rotary_dim: int = 0  # rotated dims per head (Phi-3 partial rotary); 0: all of head_dim
    layer_windows: tuple[int | None, ...] = ()  # per layer: sliding window or None; (): none
    layer_rope: tuple[str, ...] = ()  # per layer: "global", "local" or "none"; (): all global
    local_rope: RopeConfig | None = None  # the rope of "local" layers (Gemma's sliding ones)
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {self.model_type!r} is not supported; "
                f"supported: {SUPPORTED_MODEL_TYPES}"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise UnsupportedModelError(
                f"hidden_act {self.hidden_act!r} is not supported; supported: "
                f"{SUPPORTED_ACTIVATIONS}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            if getattr(self, name) <= 0:
                raise UnsupportedModelError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise UnsupportedModelError(
                f"rotary dims per head must be even and at most head_dim ({self.head_dim}), "
                f"got {self.rotary_dim}"
            )
        for name in ("layer_windows", "layer_rope"):
            if getattr(self, name) and len(getattr(self, name)) != self.num_layers:
                raise UnsupportedModelError(f"{name} needs one entry per layer")
        if self.moe is not None and len(self.moe.sparse_layers) != self.num_layers:
            raise UnsupportedModelError("the MoE layer pattern needs one entry per layer")
        if "local" in self.layer_rope and self.local_rope is None:
            raise UnsupportedModelError("layers with a local rope need local_rope")
        for tok in self.eos_token_ids:
            if not 0 <= tok < self.vocab_size:
                raise UnsupportedModelError(
                    f"eos_token_id {tok} is outside the vocabulary (vocab_size {self.vocab_size})"
                )

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

    @property
    def plain(self) -> bool:
        """The plain Llama layer (what the fused C decode step runs): none of the extras."""
        return (
            self.hidden_act == "silu"
            and not (self.qk_norm or self.sandwich_norms or self.moe or self.final_logit_softcap)
            and self.embed_scale == 1.0
            and self.rotary_dim == self.head_dim
            and not any(w is not None for w in self.layer_windows)
            and all(r == "global" for r in self.layer_rope)
        )

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (it attends over its last `window` positions), or None."""
        return self.layer_windows[layer] if self.layer_windows else None

    def rope_kind(self, layer: int) -> str:
        """Layer `layer`'s rope: "global", "local" or "none"."""
        return self.layer_rope[layer] if self.layer_rope else "global"

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from the parsed ``config.json`` of a Hugging Face checkpoint."""
        if cfg.get("model_type") == "gemma3" and isinstance(cfg.get("text_config"), dict):
            # The multimodal Gemma 3 config: its language model is a gemma3_text decoder.
            cfg = {"model_type": "gemma3_text", **cfg["text_config"],
                   **{k: cfg[k] for k in ("bos_token_id", "eos_token_id") if k in cfg}}  # fmt: skip
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
            )
        gemma = model_type in ("gemma3_text", "gemma3")
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
        if gemma and cfg.get("attn_logit_softcapping") is not None:
            raise UnsupportedModelError(
                f"attn_logit_softcapping {cfg['attn_logit_softcapping']!r} is not supported "
                "(Gemma 3 checkpoints set it to null)"
            )
        windowed = ("qwen2", "qwen3", "qwen3_moe", "smollm3")
        if model_type in windowed and cfg.get("use_sliding_window", False):
            raise UnsupportedModelError(
                f"{model_type} with use_sliding_window=true is not supported"
            )
        context = int(cfg.get("max_position_embeddings", 2048))
        window = cfg.get("sliding_window") if model_type == "mistral" else None
        if isinstance(window, int) and 0 < window < context:
            # Mistral 7B v0.1 attends over the last `sliding_window` tokens only. Up to that many
            # tokens in all, windowed attention is full attention, so serving that context is
            # exact; beyond it the engine would be wrong, so it never goes there.
            context = window
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or hidden // num_heads)
        layers = int(cfg["num_hidden_layers"])
        attention_bias = bool(cfg.get("attention_bias", False))
        global_rope, local_rope = _ropes_from_hf(cfg, head_dim)
        partial = float(cfg.get("partial_rotary_factor")
                        or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0)  # fmt: skip
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=layers,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            max_position_embeddings=context,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=global_rope,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_as_id_tuple(cfg.get("eos_token_id")),
            hidden_act=act,
            qk_norm=model_type in ("qwen3", "qwen3_moe") or gemma,
            sandwich_norms=gemma,
            norm_offset=1.0 if gemma else 0.0,
            embed_scale=math.sqrt(hidden) if gemma else 1.0,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar") if gemma else None,
            final_logit_softcap=cfg.get("final_logit_softcapping"),
            rotary_dim=int(head_dim * partial),
            layer_windows=_layer_windows(cfg, layers, gemma, context),
            layer_rope=_layer_rope(cfg, layers, gemma),
            local_rope=local_rope,
            moe=_moe_from_hf(cfg, layers) if model_type == "qwen3_moe" else None,
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: a model folder needs a Hugging Face config.json"
            )
        return cls.from_hf_dict(json.loads(path.read_text()))


def _layer_types(cfg: dict[str, Any], layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:  # older Gemma 3 configs: every `sliding_window_pattern`-th layer is global
        pattern = int(cfg.get("sliding_window_pattern", 6))
        types = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    if len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise UnsupportedModelError(f"layer_types {types!r} is not supported")
    return list(types)


def _layer_windows(
    cfg: dict[str, Any], layers: int, gemma: bool, context: int
) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if cfg.get("model_type") == "phi3":  # Phi-3: every layer, where the window is shorter
        short = isinstance(window, int) and 0 < window < context
        return (window,) * layers if short else ()
    if not gemma:
        return ()
    types = _layer_types(cfg, layers)
    if "sliding_attention" in types and not (isinstance(window, int) and window > 0):
        raise UnsupportedModelError(f"sliding_window {window!r} must be a positive integer")
    return tuple(window if t == "sliding_attention" else None for t in types)


def _layer_rope(cfg: dict[str, Any], layers: int, gemma: bool) -> tuple[str, ...]:
    if gemma:
        return tuple("local" if t == "sliding_attention" else "global"
                     for t in _layer_types(cfg, layers))  # fmt: skip
    if cfg.get("model_type") != "smollm3":
        return ()
    # SmolLM3: `no_rope_layers[i]` is 1 where layer i *uses* rope (transformers' naming).
    uses = cfg.get("no_rope_layers")
    if uses is None:
        interval = int(cfg.get("no_rope_layer_interval", 4))
        uses = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(uses) != layers:
        raise UnsupportedModelError(f"no_rope_layers needs {layers} entries, got {len(uses)}")
    return tuple("global" if u else "none" for u in uses)


def _moe_from_hf(cfg: dict[str, Any], layers: int) -> MoEConfig:
    step = int(cfg.get("decoder_sparse_step", 1))
    dense = set(cfg.get("mlp_only_layers") or [])
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)  # v5: the latter
    sparse = tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(layers))
    return MoEConfig(
        num_experts=experts,
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_layers=sparse,
    )


def _ropes_from_hf(cfg: dict[str, Any], head_dim: int) -> tuple[RopeConfig, RopeConfig | None]:
    """The global rope and, for Gemma 3, the sliding layers' local one."""
    # transformers >= 5 writes `rope_parameters` (theta inside; Gemma 3: one dict per layer
    # type); older configs use `rope_theta` + `rope_scaling` (+ Gemma's `rope_local_base_freq`).
    params = dict(cfg.get("rope_parameters") or {})
    if "full_attention" in params or "sliding_attention" in params:
        full = params.get("full_attention") or {}
        local = params.get("sliding_attention") or {}
        return _rope(cfg, full, head_dim, 1e6), _rope(cfg, local, head_dim, 1e4)
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    if cfg.get("model_type") in ("gemma3_text", "gemma3"):
        local = {"rope_theta": cfg.get("rope_local_base_freq", 1e4)}
        return _rope(cfg, params, head_dim, 1e6), _rope(cfg, local, head_dim, 1e4)
    return _rope(cfg, params, head_dim, 10000.0), None


def _rope(cfg: dict[str, Any], params: dict[str, Any], head_dim: int, theta: float) -> RopeConfig:
    theta = params.get("rope_theta", cfg.get("rope_theta", theta))
    rope_type = params.get("rope_type", params.get("type", "default"))
    context = int(cfg.get("max_position_embeddings", 2048))
    original = int(params.get("original_max_position_embeddings")
                   or cfg.get("original_max_position_embeddings") or 8192)  # fmt: skip
    factor = params.get("factor")
    extra: dict[str, Any] = {}
    if rope_type == "yarn":
        original = int(params.get("original_max_position_embeddings") or context)
        factor = float(factor if factor is not None else context / original)
        extra = dict(
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            truncate=bool(params.get("truncate", True)),
            attention_factor=_yarn_attention_factor(params, factor),
        )
    elif rope_type == "longrope":
        # transformers' Phi3Config lets the top-level field override the rope parameters' one
        original = int(cfg.get("original_max_position_embeddings")
                       or params.get("original_max_position_embeddings") or context)  # fmt: skip
        factor = float(factor if factor is not None else context / original)
        attention = params.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        # One factor set per model (see the module docstring): long when the served context
        # can exceed the original one.
        chosen = params["long_factor"] if context > original else params["short_factor"]
        extra = dict(attention_factor=float(attention), ext_factors=tuple(map(float, chosen)))
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(factor if factor is not None else 1.0),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
        **extra,
    )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention_factor(params: dict[str, Any], factor: float) -> float:
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    return _yarn_mscale(factor)


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
