#!/usr/bin/env python
"""Why Corral refuses valid MaskBench instances: each false reject of a MaskBench run, sorted.

Reads the ``--json`` report of ``bench/maskbench.py``, walks every schema with a false reject
again through Corral (the fuzz target, strict) and sorts each refused valid instance:

* ``invalid-2020-12``: MaskBench labels it valid, but Draft 2020-12 (``jsonschema``, the judge
  of every other figure) rejects it;
* ``key-order``: accepted once the instance's keys follow the order the schema declares them in
  (Corral, like OpenAI's structured outputs, llguidance and xgrammar, generates declared
  properties in their declared order; the order is taken from whichever ``properties`` in the
  schema lists most of an object's keys);
* ``other``: anything else (a rewrite or a backend limit refusing a valid instance).

A schema is counted under the set of reasons of its refused instances.

    python bench/maskbench.py --sample 2000 --engines corral-cold --json /tmp/mb.json
    python bench/maskbench_rejects.py /tmp/mb.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench"


def declared_orders(node: Any, out: list[list[str]]) -> list[list[str]]:
    """Every ``properties`` key list anywhere in the schema."""
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict):
            out.append(list(node["properties"]))
        for value in node.values():
            declared_orders(value, out)
    elif isinstance(node, list):
        for value in node:
            declared_orders(value, out)
    return out


def in_declared_order(value: Any, orders: list[list[str]]) -> Any:
    """``value`` with each object's keys in the declared order that covers most of them."""
    if isinstance(value, dict):
        best = max(orders, key=lambda o: (sum(k in value for k in o), -len(o)), default=[])
        keys = [k for k in best if k in value] + [k for k in value if k not in best]
        return {k: in_declared_order(value[k], orders) for k in keys}
    if isinstance(value, list):
        return [in_declared_order(v, orders) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="bench/maskbench.py --json output")
    ap.add_argument("--engine", default="corral-cold")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    args = ap.parse_args(argv)

    import jsonschema
    import torch

    from corral.fuzz.targets import make_target
    from corral.fuzz.tokenizers import llama3_tokenizer
    from corral.grammar.walk import check_instances

    results = json.loads(args.report.read_text())["results"][args.engine]
    files = [r["file"] for r in results if r["status"] == "ok" and r["false_reject"]]
    tok = llama3_tokenizer()
    corral = make_target("corral", tok)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    by_schema: Counter[str] = Counter()
    for name in files:
        doc = json.loads((args.corpus / name).read_text())
        handle = corral.compile(doc["schema"])
        orders = declared_orders(doc["schema"], [])
        validator = jsonschema.Draft202012Validator(doc["schema"])

        def refused(instance: Any, handle: Any = handle) -> bool:
            walk = [(instance, True)]
            return check_instances(lambda: corral.matcher(handle), walk, tok.encode, bitmask, [])[1]

        reasons = set()
        for test in doc["tests"]:
            if not test["valid"] or not refused(test["data"]):
                continue
            if not validator.is_valid(test["data"]):
                reasons.add("invalid-2020-12")
            elif refused(in_declared_order(test["data"], orders)):
                reasons.add("other")
            else:
                reasons.add("key-order")
        reason = "+".join(sorted(reasons)) or "accepted now"
        by_schema[reason] += 1
        print(f"{name}: {reason}")
    print(f"{len(files)} schemas with a false reject ({args.engine}): " +
          ", ".join(f"{n} {reason}" for reason, n in by_schema.most_common()))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
