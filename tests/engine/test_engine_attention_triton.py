"""TritonAttention: construction checks here, the kernels in the interpreter in a subprocess
(attention_triton_cases.py: TRITON_INTERPRET must be set before triton is first imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("attention_triton_cases.py")


@pytest.mark.parametrize("head_dim", [8, 96, 130])
def test_unsupported_head_dim_is_refused_at_construction(head_dim: int) -> None:
    pytest.importorskip("triton")
    from corral.engine.execution.attention_triton import TritonAttention

    with pytest.raises(ValueError, match="power-of-two head_dim >= 16.*TorchAttention"):
        TritonAttention(8, 2, head_dim, 0.1)


def test_heads_must_be_a_multiple_of_kv_heads() -> None:
    pytest.importorskip("triton")
    from corral.engine.execution.attention_triton import TritonAttention

    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        TritonAttention(6, 4, 64, 0.1)


def test_triton_attention_in_interpreter_matches_references() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(CASES.parent))
    done = subprocess.run(
        [sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "all Triton attention interpreter checks passed" in done.stdout
