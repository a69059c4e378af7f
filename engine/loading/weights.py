"""Load a Hugging Face checkpoint folder (config.json + safetensors) into a `DecoderModel`.

Hugging Face names (`model.layers.3.self_attn.q_proj.weight`, ...) are mapped onto the fused
parameters of `DecoderModel`: Q, K and V are concatenated into one `qkv_weight`, gate and up into
one `gate_up_weight` (Phi-3 checkpoints store them fused already). Gemma's `(1 + w)` norms get
their offset added here; a mixture-of-experts layer reads its router and experts (`_fill_experts`). Every parameter of the model must be filled exactly once; a missing or
misshapen tensor is an error that names it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from corral.engine.execution.model import DecoderLayer, DecoderModel
from corral.engine.execution.model_config import ModelConfig
from corral.engine.execution.moe import MoEBlock


class WeightLoadError(ValueError):
    """The checkpoint does not fit the model; the message names the tensor and the fix."""


def safetensors_files(folder: str | Path) -> list[Path]:
    """The checkpoint's safetensors files: a single `model.safetensors` or the indexed shards."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(
            f"no *.safetensors in {folder}; convert the checkpoint to safetensors "
            "(e.g. `model.save_pretrained(folder, safe_serialization=True)`)"
        )
    return files


def load_weights_from_folder(
    folder: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device | str
) -> DecoderModel:
    """Build a `DecoderModel` from the safetensors in `folder` (cast to `dtype`, on `device`).

    The model's parameters are allocated on `device` in `dtype` first; then each checkpoint
    tensor is read from its memory-mapped shard and copied (cast on the way) into its place, so
    host memory holds one checkpoint tensor at a time beside the mapped files: never a float32
    copy of the model, and on CUDA no host copy of it at all.
    """
    with ExitStack() as stack:
        sources: dict[str, Callable[[], torch.Tensor]] = {}
        for path in safetensors_files(folder):
            f = stack.enter_context(safe_open(str(path), framework="pt"))
            for name in f.keys():
                sources[name] = functools.partial(f.get_tensor, name)
        return build_model(sources, config, dtype, device)


def build_model(
    sources: Mapping[str, Callable[[], torch.Tensor]],
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | str,
) -> DecoderModel:
    """Fill a fresh `DecoderModel` from Hugging Face-named tensors, each read when needed."""
    model = DecoderModel(config, dtype, device)
    take = _Taker(sources)
    with torch.no_grad():
        _copy(model.embed, take("model.embed_tokens.weight"))
        _copy(model.norm, take("model.norm.weight").float() + config.norm_offset)
        if not config.tie_word_embeddings:
            _copy(model.lm_head, take("lm_head.weight"))
        for i, layer in enumerate(model.layers):
            _fill_layer(layer, f"model.layers.{i}.", take, config)
    # A tied checkpoint may still carry a copy of lm_head; rotary tables are recomputed.
    leftover = [
        n
        for n in sources
        if n not in take.used and not n.endswith("rotary_emb.inv_freq") and n != "lm_head.weight"
    ]
    if leftover:
        raise WeightLoadError(
            f"checkpoint has tensors this {config.model_type} decoder does not use: "
            f"{leftover[:5]}; is config.json the one for these weights?"
        )
    return model


def _fill_layer(layer: DecoderLayer, prefix: str, take: _Taker, c: ModelConfig) -> None:
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    qkv, gate_up = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")

    def norm(param: torch.nn.Parameter, name: str) -> None:
        # Gemma's norms scale by (1 + w): the offset is folded into the weight, in float32.
        _copy(param, take(prefix + name).float() + c.norm_offset)

    norm(layer.input_norm, "input_layernorm.weight")
    if c.sandwich_norms:  # Gemma 3: post_attention_layernorm normalises the attention output
        norm(layer.attn_out_norm, "post_attention_layernorm.weight")
        norm(layer.post_norm, "pre_feedforward_layernorm.weight")
        norm(layer.mlp_out_norm, "post_feedforward_layernorm.weight")
    else:
        norm(layer.post_norm, "post_attention_layernorm.weight")
    if c.qk_norm:
        norm(layer.q_norm, "self_attn.q_norm.weight")
        norm(layer.k_norm, "self_attn.k_norm.weight")
    if take.has(attn + "qkv_proj.weight"):  # Phi-3: already the engine's fused layout
        _copy(layer.qkv_weight, take(attn + "qkv_proj.weight"))
    else:
        _copy_parts(layer.qkv_weight, take, attn, qkv, "weight")
    if c.qkv_bias:
        _copy_parts(layer.qkv_bias, take, attn, qkv, "bias")
    _copy(layer.o_weight, take(attn + "o_proj.weight"))
    if c.o_bias:
        _copy(layer.o_bias, take(attn + "o_proj.bias"))
    if layer.moe is not None:
        _fill_experts(layer.moe, mlp, take)
        return
    if take.has(mlp + "gate_up_proj.weight"):  # Phi-3: gate rows, then up rows
        _copy(layer.gate_up_weight, take(mlp + "gate_up_proj.weight"))
    else:
        _copy_parts(layer.gate_up_weight, take, mlp, gate_up, "weight")
    _copy(layer.down_weight, take(mlp + "down_proj.weight"))
    if c.mlp_bias:
        _copy_parts(layer.gate_up_bias, take, mlp, gate_up, "bias")
        _copy(layer.down_bias, take(mlp + "down_proj.bias"))


def _fill_experts(moe: MoEBlock, mlp: str, take: _Taker) -> None:
    """A MoE block from either checkpoint layout: stacked (`experts.gate_up_proj`
    `[E, 2I, H]`, `experts.down_proj` `[E, H, I]`, as transformers >= 5 saves it) or one tensor
    per expert (`experts.{e}.gate_proj.weight`, ..., as the released checkpoints are)."""
    _copy(moe.router, take(mlp + "gate.weight"))
    experts = mlp + "experts."
    if take.has(experts + "gate_up_proj"):
        _copy(moe.gate_up, take(experts + "gate_up_proj"))
        _copy(moe.down, take(experts + "down_proj"))
        return
    for e in range(moe.num_experts):
        one = f"{experts}{e}."
        _copy_parts(moe.gate_up[e], take, one, ("gate_proj", "up_proj"), "weight")
        _copy(moe.down[e], take(one + "down_proj.weight"))


def _copy_parts(
    param: torch.nn.Parameter,
    take: Callable[[str], torch.Tensor],
    prefix: str,
    parts: tuple[str, ...],
    kind: str,
) -> None:
    """Fill a fused parameter part by part (its rows in order), never concatenating on the host:
    each checkpoint tensor is cast and moved straight into its slice."""
    values = [take(f"{prefix}{p}.{kind}") for p in parts]
    rows = sum(v.shape[0] for v in values)
    if rows != param.shape[0] or any(v.shape[1:] != param.shape[1:] for v in values):
        shapes = [tuple(v.shape) for v in values]
        raise WeightLoadError(
            f"tensors {parts} of {prefix} have shapes {shapes}, which do not stack into parameter "
            f"shape {tuple(param.shape)}; config.json disagrees with the weights"
        )
    start = 0
    for v in values:
        param[start : start + v.shape[0]].copy_(v)
        start += v.shape[0]


class _Taker:
    """Reads tensors by name and remembers which were used, to report the unused ones."""

    def __init__(self, sources: Mapping[str, Callable[[], torch.Tensor]]) -> None:
        self.sources = sources
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.sources

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self.sources:
            raise WeightLoadError(
                f"checkpoint is missing tensor {name!r}; the folder's weights do not match its "
                "config.json (wrong architecture or a partial download?)"
            )
        self.used.add(name)
        return self.sources[name]()


def _copy(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise WeightLoadError(
            f"tensor shape {tuple(value.shape)} does not fit parameter shape {tuple(param.shape)}; "
            "config.json disagrees with the weights"
        )
    param.copy_(value)
