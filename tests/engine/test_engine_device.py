"""Device and dtype: `--device`/`--dtype` parsing, loading straight into the target dtype, GGUF
dequantized to it tensor by tensor, Mistral's sliding window, and the CLI refusing CUDA here.

CUDA itself is exercised by test_engine_cuda.py (skipped without a GPU) and bench/gpu_check.sh.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from corral.api.config import ServerConfig
from corral.engine.execution.batch import ForwardBatch
from corral.engine.execution.device import parse_device, parse_dtype
from corral.engine.execution.model_config import ModelConfig
from corral.engine.loading.assets import default_gguf_path, ensure_converted, load_model
from corral.engine.loading.gguf_loader import write_safetensors_streaming

NO_CUDA = not torch.cuda.is_available()


def test_cpu_device_and_auto_dtype_is_float32_there():
    assert parse_device("cpu") == torch.device("cpu") == parse_device(" CPU ")
    assert parse_dtype("auto", torch.device("cpu")) == torch.float32
    assert parse_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert parse_dtype("float16", torch.device("cpu")) == torch.float16


@pytest.mark.parametrize("text", ["tpu", "cuda:x", "", "cpu:1", "mps"])
def test_unknown_devices_are_refused(text):
    with pytest.raises(ValueError, match="not one of cpu, cuda"):
        parse_device(text)


@pytest.mark.parametrize("text", ["float64", "int8", "fp8", "half"])
def test_unknown_dtypes_are_refused(text):
    with pytest.raises(ValueError, match="not one of auto, float32, bfloat16, float16"):
        parse_dtype(text, torch.device("cpu"))


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA: the refusal cannot happen")
@pytest.mark.parametrize("text", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_refused_before_anything_loads(text):
    with pytest.raises(ValueError, match="CUDA is not available here"):
        parse_device(text)
    with pytest.raises(ValueError, match="CUDA is not available here"):
        ServerConfig(device=text)


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA: the refusal cannot happen")
def test_corral_serve_device_cuda_exits_with_the_reason():
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "serve", "--device", "cuda", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "CUDA is not available here" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_gpu_memory_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match="GPU memory fraction"):
        ServerConfig(gpu_memory_fraction=fraction)


def test_server_config_flags_and_environment_reach_the_engine():
    env = {"CORRAL_DTYPE": "bfloat16", "CORRAL_GPU_MEMORY_FRACTION": "0.5"}
    config = ServerConfig.from_sources({"device": "cpu"}, env)
    assert (config.torch_device, config.torch_dtype) == (torch.device("cpu"), torch.bfloat16)
    assert config.engine_config().gpu_memory_fraction == 0.5


def _mistral(**extra) -> dict:
    return {
        "model_type": "mistral",
        "vocab_size": 32000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        **extra,
    }


def test_mistral_sliding_window_caps_the_context_at_the_window():
    # Within the window, windowed attention is full attention: serving that context is exact.
    assert ModelConfig.from_hf_dict(_mistral(sliding_window=4096)).max_position_embeddings == 4096
    assert ModelConfig.from_hf_dict(_mistral(sliding_window=None)).max_position_embeddings == 32768
    wide = _mistral(sliding_window=65536)
    assert ModelConfig.from_hf_dict(wide).max_position_embeddings == 32768


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_streamed_safetensors_read_back_exactly(tmp_path, dtype):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(3, 5, generator=g).to(dtype),
        "b.weight": torch.randn(7, generator=g).to(dtype),
        "c": torch.randn(2, 3, 4, generator=g).to(dtype),
    }
    made = []

    def produce(name):
        made.append(name)
        return tensors[name]

    path = tmp_path / "model.safetensors"
    entries = [(n, tuple(t.shape)) for n, t in tensors.items()]
    write_safetensors_streaming(path, entries, produce, dtype)
    assert made == list(tensors)  # each made once, in order, when its turn came
    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == set(tensors)
        for name, t in tensors.items():
            assert torch.equal(f.get_tensor(name), t)


def test_streamed_safetensors_refuse_a_tensor_unlike_its_header(tmp_path):
    entries = [("a", (2, 2))]
    with pytest.raises(ValueError, match="declared"):
        write_safetensors_streaming(
            tmp_path / "x.safetensors", entries, lambda n: torch.zeros(3), torch.float32
        )


def test_gguf_is_dequantized_straight_to_bfloat16(smollm2_folder, tmp_path):
    """A bfloat16 server converts the default GGUF to its own bfloat16 folder: every tensor is
    the float32 conversion's, rounded once."""
    folder = ensure_converted(default_gguf_path(), tmp_path, torch.bfloat16)
    assert folder.name.endswith("-bfloat16")
    size = (folder / "model.safetensors").stat().st_size
    assert size * 2 < (smollm2_folder / "model.safetensors").stat().st_size * 1.01
    with (
        safe_open(str(folder / "model.safetensors"), "pt") as half,
        safe_open(str(smollm2_folder / "model.safetensors"), "pt") as full,
    ):
        assert set(half.keys()) == set(full.keys())
        for name in full.keys():
            got = half.get_tensor(name)
            assert got.dtype == torch.bfloat16
            assert torch.equal(got, full.get_tensor(name).to(torch.bfloat16)), name


def test_load_model_in_bfloat16_matches_float32_weights_cast(tiny_model_folder, tiny_model):
    half = load_model(str(tiny_model_folder), dtype=torch.bfloat16)
    assert half.runner.dtype == torch.bfloat16
    full, low = tiny_model.runner.model, half.runner.model
    assert torch.equal(low.embed, full.embed.to(torch.bfloat16))
    pool_full, pool_half = tiny_model.runner.make_kv_pool(32), half.runner.make_kv_pool(32)
    assert pool_full.dtype == torch.float32 and pool_half.dtype == torch.bfloat16
    ids = tiny_model.tokenizer("the same prompt in both dtypes")["input_ids"]
    want = tiny_model.runner.forward(
        ForwardBatch.from_sequences([ids], [pool_full.alloc(len(ids))]), pool_full
    )
    got = half.runner.forward(
        ForwardBatch.from_sequences([ids], [pool_half.alloc(len(ids))]), pool_half
    )
    assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    # bfloat16 keeps 8 bits of mantissa: a random 2-layer model's logits (|x| < ~1) agree to 0.05.
    assert (got - want).abs().max().item() < 0.05
