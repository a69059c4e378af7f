"""The first line every benchmark prints: which script, when, at which commit, on what.

BENCHMARKS.md quotes figures together with this line, so each one says where it came from.
Benchmarks are modules of the ``bench`` package, run from the repository root as
``python -m bench.<name>`` (never as files: a file run puts its own folder first on ``sys.path``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path


def commit() -> str:
    """The checked-out commit, with ``+dirty`` when the tree has uncommitted changes."""
    here = Path(__file__).resolve().parent
    run = lambda *a: subprocess.run(  # noqa: E731
        ["git", *a], cwd=here, capture_output=True, text=True
    ).stdout.strip()
    head = run("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if run("status", "--porcelain", "--untracked-files=no") else "")


def header(script: str) -> str:
    """``bench/<script>, <UTC time>, commit <sha>, <n> CPUs, load <1-min average>, Python x.y``."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    py = ".".join(map(str, sys.version_info[:2]))
    return (
        f"bench/{Path(script).name}, {now}, commit {commit()}, {os.cpu_count()} CPUs, "
        f"load {load:.1f}, Python {py}"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
