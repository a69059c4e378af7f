"""What `accept()` costs now that it agrees with the mask where bytes are forced.

llguidance's mask allows only the canonical first token of forced bytes, while its
`consume_token` takes any spelling of them (`quirks.FORCED_BYTES_MASK_ONE_SPELLING`), so
Corral's `LLGuidanceMatcher.accept` first asks llguidance for its forced tokens
(`compute_ff_tokens`) and refuses any other. This bench walks MaskBench's valid instances
(Llama-3 tokenizer, `json.dumps` layout) and times, at every position, the mask fill, Corral's
`accept`, and llguidance's `try_consume` alone on the same token from the same state; it prints
the mean of each and the extra cost of the check.

    python -m bench.accept_cost [--subset Github_medium] [--schemas 60]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import torch

from corral.fuzz.tokenizers import llama3_tokenizer
from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.backends.llg import LLGuidanceMatcher, try_consume
from corral.grammar.core.spec import JsonFormat

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "maskbench")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subset", default="Github_medium")
    ap.add_argument("--schemas", type=int, default=60)
    args = ap.parse_args()
    tok = llama3_tokenizer()
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    mask_s = accept_s = raw_s = 0.0
    n = 0
    for path in sorted(glob.glob(os.path.join(CORPUS, f"{args.subset}---*.json")))[: args.schemas]:
        with open(path) as f:
            data = json.load(f)
        spec = ConstraintSpec.json_schema(data["schema"], json_format=JsonFormat.python_default())
        try:
            compiled = compile_constraint(spec, tok)
        except ConstraintError:
            continue
        for case in data.get("tests", []):
            m = compiled.matcher()
            if not case["valid"] or not isinstance(m, LLGuidanceMatcher):
                continue
            for t in tok.encode(json.dumps(case["data"], ensure_ascii=False)):
                t0 = time.perf_counter()
                m.fill_mask(bitmask, 0)
                t1 = time.perf_counter()
                ok = m.accept(t)
                t2 = time.perf_counter()
                if not ok:
                    break
                m.rollback(1)
                t3 = time.perf_counter()
                try_consume(m.native_cursor(), [t])
                t4 = time.perf_counter()
                m.native_cursor().rollback(1)  # llguidance's own step undone, untimed
                m.accept(t)  # and the walk goes on through Corral's matcher
                mask_s, accept_s, raw_s = mask_s + t1 - t0, accept_s + t2 - t1, raw_s + t4 - t3
                n += 1
    if not n:
        raise SystemExit(f"no instance walked: is {CORPUS} there?")
    us = 1e6 / n
    print(f"{n} positions of {args.subset} ({args.schemas} schemas): mask fill {mask_s * us:.1f} us, "
          f"accept {accept_s * us:.1f} us, try_consume alone {raw_s * us:.1f} us, "
          f"the forced-token check {(accept_s - raw_s) * us:.1f} us per accept")  # fmt: skip


if __name__ == "__main__":
    main()
