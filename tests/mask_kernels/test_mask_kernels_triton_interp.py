"""Runs the Triton kernels in interpreter mode (CPU) in a subprocess; see triton_interp_cases.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("triton_interp_cases.py")


def test_triton_kernels_in_interpreter_match_reference():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(CASES.parent))
    done = subprocess.run(
        [sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "all Triton interpreter checks passed" in done.stdout
