#!/usr/bin/env python
"""Why Corral refuses valid MaskBench instances: each false reject of a MaskBench run, sorted.

Reads the ``--json`` report of ``bench/maskbench.py``, walks every schema with a false reject
again through Corral (the fuzz target, strict) and sorts each refused valid instance:

* ``invalid-2020-12``: MaskBench labels it valid, but Draft 2020-12 (``jsonschema``, the judge
  of every other figure) rejects it;
* ``key-order``: accepted once the instance's keys follow the order the schema declares them in
  (Corral, like OpenAI's structured outputs, llguidance and xgrammar, generates declared
  properties in their declared order; the order is taken from whichever ``properties`` in the
  schema lists most of an object's keys), or else once keys are moved one at a time, each move
  taking the refusal further into the instance (properties merged from ``oneOf`` follow a
  node's own, which no single ``properties`` list says): ``key-order (moved)``;
* ``other``: anything else (a rewrite or a backend limit refusing a valid instance).

A schema is counted under the set of reasons of its refused instances.

    python -m bench.maskbench --sample 2000 --engines corral-cold --json /tmp/mb.json
    python -m bench.maskbench_rejects /tmp/mb.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.provenance import header

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


def refused_at(accepts_prefix: Any, instance: Any) -> int | None:
    """Where (a character offset of ``json.dumps(instance)``) the walk refuses; None: accepted."""
    return accepts_prefix(json.dumps(instance, ensure_ascii=False))


def key_offsets(value: Any, path: tuple = (), out: list | None = None, at: int = 0) -> tuple:
    """(offset, path of the object, key) of every key in ``json.dumps(value)``, and its length."""
    out = [] if out is None else out
    if isinstance(value, dict):
        at += 1
        for i, (key, item) in enumerate(value.items()):
            at += 2 if i else 0
            out.append((at, path, key))
            at += len(json.dumps(key, ensure_ascii=False)) + 2
            _, at = key_offsets(item, (*path, key), out, at)
        return out, at + 1
    if isinstance(value, list):
        at += 1
        for i, item in enumerate(value):
            at += 2 if i else 0
            _, at = key_offsets(item, (*path, i), out, at)
        return out, at + 1
    return out, at + len(json.dumps(value, ensure_ascii=False))


def moved_into_order(accepts_prefix: Any, instance: Any, limit: int = 200) -> bool:
    """Whether moving keys one at a time (at the last key before each refusal: a later key of
    that object to its place, or it to an earlier place) reaches an order the walk accepts."""
    current = json.loads(json.dumps(instance))
    for _ in range(limit):
        at = refused_at(accepts_prefix, current)
        if at is None:
            return True
        keys = [k for k in key_offsets(current)[0] if k[0] <= at]
        if not keys:
            return False
        _, path, key = keys[-1]
        for order in _orders(list(_get(current, path)), key):
            trial = json.loads(json.dumps(current))
            node = _get(trial, path)
            moved = {k: node[k] for k in order}
            node.clear()
            node.update(moved)
            further = refused_at(accepts_prefix, trial)
            if further is None or further > at:
                current = trial
                break
        else:
            return False
    return False


def _orders(keys: list[str], key: str) -> list[list[str]]:
    i = keys.index(key)
    later = [[*keys[:i], k, *[q for q in keys[i:] if q != k]] for k in keys[i + 1 :]]
    earlier = [[*keys[:j], key, *[q for q in keys[j:] if q != key]] for j in range(i - 1, -1, -1)]
    return later + earlier


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="bench/maskbench.py --json output")
    ap.add_argument("--engine", default="corral-cold")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    args = ap.parse_args(argv)
    print(header(__file__), flush=True)
    print(f"walking the false rejects of {args.engine} in {args.report} again")

    import jsonschema
    import torch

    from corral.fuzz.targets import make_target
    from corral.fuzz.tokenizers import llama3_tokenizer
    from corral.grammar.core.walk import token_allowed

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

        def accepts_prefix(text: str, handle: Any = handle) -> int | None:
            """Walk ``text``; the offset of the refused token, or None when accepted whole."""
            ids, matcher = tok.encode(text), corral.matcher(handle)
            for k, token in enumerate(ids):
                matcher.fill_mask(bitmask, 0)
                if not token_allowed(bitmask, 0, token) or not matcher.accept(token):
                    return len(tok.hf_tokenizer.decode(ids[:k]))
            return None if matcher.can_terminate() else len(text)

        def refused(instance: Any) -> bool:
            return refused_at(accepts_prefix, instance) is not None

        reasons = set()
        for test in doc["tests"]:
            if not test["valid"] or not refused(test["data"]):
                continue
            if not validator.is_valid(test["data"]):
                reasons.add("invalid-2020-12")
            elif not refused(in_declared_order(test["data"], orders)):
                reasons.add("key-order")
            elif moved_into_order(accepts_prefix, test["data"]):
                reasons.add("key-order (moved)")
            else:
                reasons.add("other")
        reason = "+".join(sorted(reasons)) or "accepted now"
        by_schema[reason] += 1
        print(f"{name}: {reason}")
    print(f"{len(files)} schemas with a false reject ({args.engine}): " +
          ", ".join(f"{n} {reason}" for reason, n in by_schema.most_common()))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
