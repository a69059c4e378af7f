"""Corral's cold time to first mask in one process: compile through a cold ``CompileService``
(as ``corral serve`` builds it), then the first mask of a fresh matcher, schema after schema.

MaskBench times the same thing inside its worker processes, beside the other engines; this
leaves the harness out, so two commits' compile paths can be compared alone (run it from each
commit's install, alternating).

    .venv/bin/python -m bench.compile_ttfm --sample 400
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core, as in MaskBench

import torch

from bench.provenance import header
from corral.grammar import ConstraintError, ConstraintSpec, JsonFormat
from corral.schema_cache import CacheConfig, CompileService

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench"


def reference_tokenizer():
    """Llama-3's tokenizer; from ``corral.grammar`` in commits before issue 12 moved it, so the
    script also measures those."""
    try:
        from corral.fuzz.tokenizers import llama3_tokenizer
    except ImportError:
        from corral.grammar import TokenizerInfo

        return TokenizerInfo.llama3()
    return llama3_tokenizer()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--sample", type=int, default=400, help="schemas, shuffled with seed 0")
    args = ap.parse_args(argv)
    print(header(__file__), flush=True)
    torch.set_num_threads(1)
    files = sorted(args.corpus.rglob("*.json"))
    random.Random(0).shuffle(files)
    tok = reference_tokenizer()
    with tempfile.TemporaryDirectory() as root:
        service = CompileService(tok, CacheConfig(root=Path(root), prestart_workers=True))
        bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
        layout = JsonFormat.python_default()
        times = []
        for path in files[: args.sample]:
            schema = json.loads(path.read_text())["schema"]
            t0 = time.perf_counter()
            try:
                spec = ConstraintSpec.json_schema(schema, json_format=layout)
                service.get_or_compile(spec).matcher().fill_mask(bitmask, 0)
            except ConstraintError:
                continue
            times.append((time.perf_counter() - t0) * 1e3)
        service.close()
    q = statistics.quantiles(times, n=20)
    print(f"{len(times)} of {min(args.sample, len(files))} schemas compiled; time to first mask "
          f"p50 {statistics.median(times):.2f} ms, p95 {q[18]:.2f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
