"""MaskBench's engines, as run inside one worker process each (``python -P -m maskbench_engines``
with this folder on ``PYTHONPATH``; see ``maskbench.engine_worker``).

The engines are the fuzzer's targets (:mod:`corral.fuzz.targets`, configured once for both) plus
Corral through its compile service on a disk cache: ``corral-cold`` starts from an empty cache
folder, ``corral-warm`` reads what ``corral-cold`` wrote (a new process, the same folder).
Every engine turns a JSON schema into a per-instance ``Matcher``, so the token-by-token check is
the same code for all; the time to first mask covers the compile (or the cache load) and the
first mask of a fresh matcher.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from corral.base.heap import freeze_startup_heap
from corral.base.supervisor import child_channel
from corral.fuzz.targets import CorralTarget, Refused, Target, make_target, target_config
from corral.fuzz.tokenizers import llama3_tokenizer
from corral.grammar import TokenizerInfo
from corral.grammar.core.walk import check_instances

CORRAL_CACHED = ("corral-cold", "corral-warm")


def corral_cached(tok: TokenizerInfo, cache_dir: str) -> CorralTarget:
    """Corral configured as ``corral serve`` configures it: a compile service on ``cache_dir``
    whose compile workers start with it."""
    from corral.schema_cache import CacheConfig, CompileService

    service = CompileService(tok, CacheConfig(root=cache_dir, prestart_workers=True))
    return CorralTarget(tok, service)


def make_engine(engine: str, tok: TokenizerInfo, cache_dir: str) -> Target:
    """``corral-cold`` / ``corral-warm`` (cached on ``cache_dir``) or a fuzz target by name."""
    return corral_cached(tok, cache_dir) if engine in CORRAL_CACHED else make_target(engine, tok)


def engine_config(engine: str) -> dict[str, Any]:
    """How ``engine`` is configured, for the report (computed without building it)."""
    if engine not in CORRAL_CACHED:
        return target_config(engine)
    cache = "empty at the start" if engine == "corral-cold" else "written by corral-cold"
    return {
        **target_config("corral"),
        "compile": f"CompileService: memory LRU, disk cache ({cache}), compile workers",
    }


def run_schema(engine: Target, tok: TokenizerInfo, path: str) -> dict[str, Any]:
    """Compile one MaskBench file and check every test instance token by token.

    ``masks_us`` holds every mask's time, instance after instance; ``instance_masks`` how many
    of them each instance took (a walk stops at the first token refused), so that engines can
    be compared over the positions all of them reached.
    """
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    result: dict[str, Any] = {"file": os.path.basename(path), "masks_us": []}
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    t0 = time.perf_counter()
    try:
        handle = engine.compile(doc["schema"])
        engine.matcher(handle).fill_mask(bitmask, 0)
    except Refused as e:
        result.update(status="compile_error", error=str(e)[:300])
        return result
    result["ttfm_ms"] = (time.perf_counter() - t0) * 1e3
    false_accept = false_reject = 0
    counts = []
    for t in doc.get("tests", []):
        before = len(result["masks_us"])
        fa, fr = check_instances(
            lambda: engine.matcher(handle),
            [(t["data"], t["valid"])],
            tok.encode,
            bitmask,
            result["masks_us"],
        )
        false_accept, false_reject = false_accept + fa, false_reject + fr
        counts.append(len(result["masks_us"]) - before)
    result.update(
        status="ok", false_accept=false_accept, false_reject=false_reject, instance_masks=counts
    )
    return result


def main() -> None:
    """The worker: ``{"engine", "cache_dir"}`` in, ``b"ready"``, then one schema path in and its
    result (JSON) out per frame."""
    channel = child_channel()
    init = channel.recv()
    if init is None:
        return
    torch.set_num_threads(1)
    config = json.loads(init)
    tok = llama3_tokenizer()
    engine = make_engine(config["engine"], tok, config["cache_dir"])
    freeze_startup_heap()  # as `corral serve` does, for every engine alike
    channel.send(b"ready")
    while (frame := channel.recv()) is not None:
        path = frame.decode()
        try:
            result = run_schema(engine, tok, path)
        except Exception as e:  # an engine bug on one schema is a result, not the end of the run
            result = {"file": os.path.basename(path), "status": "crash", "error": repr(e)[:300]}
        channel.send(json.dumps(result).encode())


if __name__ == "__main__":
    main()
