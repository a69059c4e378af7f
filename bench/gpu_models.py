"""What bench/gpu_engine.py's two parts share: random-weight Llama models (real shapes, seeded),
an engine on them with the KV pool sized by `kv_cache_bytes`, and the summary table.
"""

from __future__ import annotations

import torch

from corral.engine import EngineConfig
from corral.engine.execution.model import DecoderModel
from corral.engine.execution.model_config import ModelConfig, RopeConfig
from corral.engine.execution.model_runner import ModelRunner
from corral.engine.loading.assets import LoadedModel
from corral.fuzz.tokenizers import LLAMA3_EOS_TOKEN_IDS, LLAMA3_VOCAB_SIZE

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, head dim
    "smoke": (256, 512, 2, 4, 2, 64),
    "tiny": (256, 768, 4, 4, 2, 64),
    "8b": (4096, 14336, 32, 32, 8, 128),  # Llama-3.1-8B
}


class Summary:
    """Rows of the final table: (part, what, ours, reference, verdict); a False check fails."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []
        self.failed = False

    def check(self, part: str, what: str, ok: bool, ours: str, ref: str = "") -> None:
        self.failed |= not ok
        self.rows.append((part, what, ours, ref, "ok" if ok else "FAIL"))
        print(f"  [{'ok' if ok else 'FAIL'}] {what}: {ours} {ref}", flush=True)

    def figure(self, part: str, what: str, ours: str, ref: str, ratio: str) -> None:
        self.rows.append((part, what, ours, ref, ratio))
        print(f"  {what}: {ours} | {ref} | {ratio}", flush=True)

    def print(self) -> None:
        print("== summary (part, what, ours, reference, verdict or ratio)")
        for part, what, ours, ref, verdict in self.rows:
            print(f"{part:<2} {what:<34} {ours:<44} {ref:<30} {verdict}")
        print(f"== {'FAILED' if self.failed else 'all checks passed'}")


def llama_config(shape: str) -> ModelConfig:
    hidden, inter, layers, heads, kv_heads, head_dim = SHAPES[shape]
    rope = RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0)  # Llama 3.1's scaling
    return ModelConfig(
        model_type="llama",
        vocab_size=LLAMA3_VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope=rope,
        bos_token_id=128000,
        eos_token_ids=LLAMA3_EOS_TOKEN_IDS,
    )


def random_model(config: ModelConfig, dtype: torch.dtype, device: str, seed: int) -> DecoderModel:
    """Weights drawn where they live: normal with std 1/sqrt(fan_in) (activations and logits keep
    a std of about 1), norms 1."""
    model = DecoderModel(config, dtype, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)
    return model


def runner_for(model: DecoderModel) -> ModelRunner:
    # oneDNN-packed weights are the CPU default; on CUDA there is nothing to pack
    return ModelRunner(model, pack_weights=model.embed.device.type == "cpu")


def loaded(runner: ModelRunner, tok, name: str) -> LoadedModel:
    return LoadedModel(
        runner, tok, chat_template=None, eos_token_ids=list(LLAMA3_EOS_TOKEN_IDS), name=name
    )


def engine_config(**fields) -> EngineConfig:
    """KV sized by `kv_cache_bytes` on every device (the CUDA default fills the GPU instead)."""
    return EngineConfig(gpu_memory_fraction=None, **fields)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
