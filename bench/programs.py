"""An SGLang program's fork over the radix cache: prefilled tokens and time, against re-sending.

The program (SGLang's own frontend, ``sgl.RuntimeEndpoint``) reads a document of about
``--prefix`` tokens, forks into ``--branches`` branches that each extract one field with
``gen``, and joins them. Two `corral serve` processes run it in turn, greedy, same model:

- ``cached``: the default server; the fork prefills the shared document once (the frontend's
  prefill-only request) and every branch finds it in the radix cache;
- ``resend``: the same server with ``--prefix-cache false``, so every request prefills its whole
  prompt, as a server without prefix caching would.

Prefilled tokens come from each server's ``/metrics``: prompt tokens minus radix-cache hits.
The bound printed is the issue's: at most 1.2 x one prefix plus the branches' own tokens.

    .venv/bin/python -m bench.programs [--prefix 1000] [--branches 8]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import httpx

from bench.provenance import free_port, header

API_KEY = "bench-key"
FIELDS = ["the company's name", "the city", "the year it was founded", "the product",
          "the number of employees", "the chief executive", "the main competitor",
          "the stock ticker", "the head office street", "the colour of the logo"]  # fmt: skip
SENTENCES = [
    "Harbor Lane Instruments was founded in 1987 in the city of Tromso by a small team.",
    "Its chief executive, Ingrid Vale, built the company around one product, the tide gauge.",
    "The company employs 412 people and trades on the Oslo exchange as HLIN.",
    "Its main competitor is Nordmarin, whose gauges are cheaper but drift in cold water.",
    "The head office stands at 14 Storgata, and the logo is a teal wave on white.",
]


def document(tokenizer, tokens: int) -> str:
    """A report of about ``tokens`` tokens (the sentences repeated, numbered)."""
    parts, n = [], 0
    while n < tokens:
        sentence = f"({len(parts) + 1}) {SENTENCES[len(parts) % len(SENTENCES)]} "
        n += len(tokenizer.encode(sentence))
        parts.append(sentence)
    return "Report.\n" + "".join(parts) + "\n"


def start(args: list[str], cache: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "corral.cli", "serve", "--port", str(port), "--api-key",
           API_KEY, "--cache-dir", cache, "--max-concurrent", "16", *args]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"corral serve {' '.join(args)} did not start")


def counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    read = lambda name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # noqa: E731
    return read("corral_prompt_tokens_total"), read("corral_radix_cache_hit_tokens_total")


def question(i: int) -> str:
    return f"Question: what is {FIELDS[i % len(FIELDS)]}?\nAnswer:"


def run(url: str, doc: str, branches: int) -> dict:
    import sglang as sgl

    @sgl.function
    def extract(s, doc):
        s += doc
        forks = s.fork(branches)
        for i, f in enumerate(forks):
            f += question(i)
            f += sgl.gen("answer", max_tokens=8, temperature=0, stop="\n")
        forks.join()

    backend = sgl.RuntimeEndpoint(url, api_key=API_KEY)
    prompt0, hit0 = counters(url)
    t0 = time.perf_counter()
    state = extract.run(doc=doc, backend=backend)
    answers = state["answer"]  # the program runs in the background: this waits for its end
    seconds = time.perf_counter() - t0
    prompt1, hit1 = counters(url)
    return {"seconds": seconds, "prompt": prompt1 - prompt0, "hit": hit1 - hit0,
            "answers": answers}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix", type=int, default=1000, help="document tokens (default 1000)")
    p.add_argument("--branches", type=int, default=8, help="fork width (default 8)")
    a = p.parse_args()
    print(header(__file__))
    from transformers import AutoTokenizer

    from corral.engine.loading.assets import resolve_model_folder

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_folder(None)))
    doc = document(tokenizer, a.prefix)
    prefix = len(tokenizer.encode(doc))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(resolve_model_folder(None).parent, os.path.join(tmp, "models"))
        for name, flags in (("cached", []), ("resend", ["--prefix-cache", "false"])):
            proc, url = start(flags, tmp)
            try:
                results[name] = run(url, doc, a.branches)
            finally:
                proc.terminate()
                proc.wait(30)
    c, r = results["cached"], results["resend"]
    # the branches' own prompt tokens: what each adds to the document
    own = sum(len(tokenizer.encode(doc + question(i))) - prefix for i in range(a.branches))
    bound = 1.2 * prefix + own
    print(f"program: a {prefix}-token document, fork({a.branches}), one gen of <= 8 tokens each")
    print(f"{'server':<8} {'prompt tok':>10} {'cache hits':>10} {'prefilled':>10} {'seconds':>8}")
    for name, x in results.items():
        print(f"{name:<8} {x['prompt']:>10.0f} {x['hit']:>10.0f} "
              f"{x['prompt'] - x['hit']:>10.0f} {x['seconds']:>8.2f}")  # fmt: skip
    cached_prefill = c["prompt"] - c["hit"]
    verdict = "within" if cached_prefill <= bound else "OVER"
    print(f"cached prefilled {cached_prefill:.0f} tokens: {verdict} the bound 1.2 x {prefix} + "
          f"{own:.0f} branch tokens = {bound:.0f}")  # fmt: skip
    print(f"prefilled tokens resend/cached: {(r['prompt'] - r['hit']) / cached_prefill:.2f}x; "
          f"time resend/cached: {r['seconds'] / c['seconds']:.2f}x")  # fmt: skip
    same = c["answers"] == r["answers"]
    print(f"same answers in both runs (greedy): {same}")


if __name__ == "__main__":
    main()
