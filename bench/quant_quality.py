"""What serving a GGUF quantized costs in quality and memory, against the same file in float32.

    python -m bench.quant_quality [--gguf PATH] [--dtype float32|bfloat16]

Prints, for the quantized path (`--quantize gguf`) against the file dequantized to float32
(`--quantize none`), over every position of a few chat prompts: the KL divergence of the
next-token distribution (mean and max), top-1 agreement (all rows, and rows where the reference's
best two logits are more than 0.5 apart), and, from a fresh process, the memory the quantized
load adds (peak and after) over the file's size, and the load time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from bench.provenance import header
from corral.engine.execution.batch import ForwardBatch
from corral.engine.loading.assets import default_gguf_path, load_model

PROMPTS = (
    "Give me a JSON object describing a cat.",
    "Explain how a bicycle works, briefly.",
    "Write a haiku about the sea.",
    "What are the main causes of inflation?",
)
_MEMORY = """
import gc, json, sys, time, torch
from corral.engine.loading.assets import ensure_converted
from corral.engine.execution.model_config import ModelConfig
from corral.engine.loading.gguf_weights import load_gguf_quantized
def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024
path = sys.argv[1]
config = ModelConfig.from_folder(ensure_converted(path, None, weights=False))
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize
from corral.engine.kernels.quant import int4_from_gguf, int4_linear
# Page in the kernels' code once (a fixed cost of the process, not of the model).
w = int4_from_gguf(quantize(np.ones((32, 64), dtype=np.float32), QT.Q4_1), QT.Q4_1)
int4_linear(torch.zeros(1, 64), w, None)
del w
gc.collect()
before, t = status("VmRSS"), time.perf_counter()
model = load_gguf_quantized(path, config, getattr(torch, sys.argv[2]))
seconds = time.perf_counter() - t
gc.collect()
print(json.dumps({"peak": status("VmHWM") - before, "after": status("VmRSS") - before,
                  "seconds": seconds}))
"""


def all_rows(model, prompts: list[list[int]]) -> torch.Tensor:
    pool = model.runner.make_kv_pool(sum(map(len, prompts)) + 1)
    kvs = [pool.alloc(len(p)) for p in prompts]
    rows = torch.arange(sum(map(len, prompts)))
    return model.runner.forward(ForwardBatch.from_sequences(prompts, kvs, rows), pool)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="a .gguf file (default: the embedded model)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    path = str(args.gguf or default_gguf_path())
    print(header("bench/quant_quality.py"))
    ref = load_model(path, quantize="none")
    ours = load_model(path, quantize="gguf", dtype=getattr(torch, args.dtype))
    prompts = []
    for q in PROMPTS:
        enc = ref.tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                add_generation_prompt=True)  # fmt: skip
        prompts.append(list(enc if isinstance(enc, list) else enc["input_ids"]))
    want, got = all_rows(ref, prompts), all_rows(ours, prompts)
    p, q = torch.log_softmax(want, -1), torch.log_softmax(got, -1)
    kl = (p.exp() * (p - q)).sum(-1)
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.5
    agree = want.argmax(-1) == got.argmax(-1)
    print(f"{Path(path).name}, quantized ({args.dtype} activations) vs float32, {len(kl)} rows")
    print(f"KL(reference || quantized) per row: mean {kl.mean():.2e}, max {kl.max():.2e}")
    print(f"top-1 agreement: {agree.float().mean():.3f} of all rows, "
          f"{agree[clear].float().mean():.3f} of the {int(clear.sum())} rows with a margin > 0.5")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _MEMORY, path, args.dtype],
                          capture_output=True, text=True, check=True)  # fmt: skip
    mem = json.loads(done.stdout.strip().splitlines()[-1])
    size = Path(path).stat().st_size
    print(f"load (fresh process): {mem['seconds']:.2f} s; memory added: peak "
          f"{mem['peak'] / 2**20:.0f} MiB ({mem['peak'] / size:.2f}x the file), after "
          f"{mem['after'] / 2**20:.0f} MiB ({mem['after'] / size:.2f}x); file {size / 2**20:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
