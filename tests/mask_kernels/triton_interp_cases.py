"""The Triton kernels under TRITON_INTERPRET=1 on CPU tensors, against the plain reference.

Run by test_mask_kernels_triton_interp.py in a fresh interpreter, because the variable must be
set before triton is first imported and other packages' tests share the pytest process.
Shapes stay tiny: the interpreter executes every program in numpy.
"""

from __future__ import annotations

import math
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1 (see test_mask_kernels_triton_interp.py)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from mask_kernels_reference import RowParams, apply_reference, sample_row  # noqa: E402
from test_mask_kernels_apply import cases, random_words, same_bits  # noqa: E402
from test_mask_kernels_sample import build, row_params, sample_cases  # noqa: E402

from corral.mask_kernels.ops import sample_triton  # noqa: E402
from corral.mask_kernels.sampling_torch import sample_torch  # noqa: E402
from corral.mask_kernels.triton_kernels import apply_bitmask_triton_  # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(case=cases())
def check_apply(case):
    rng = np.random.default_rng(case["seed"])
    n_masks = case["batch"] if case["rows"] is None else len(case["rows"])
    bitmask = random_words(rng, n_masks, case["words"], case["density"])
    logits = torch.from_numpy(rng.standard_normal((case["batch"], case["vocab"])))
    logits = logits.to(case["dtype"])
    rows = None if case["rows"] is None else torch.tensor(case["rows"], dtype=torch.int64)
    expected = apply_reference(logits, bitmask, case["rows"])
    apply_bitmask_triton_(logits, bitmask, rows)
    assert same_bits(logits, expected)


def compare(logits, bitmask, rows, params) -> None:
    masked = apply_reference(logits, bitmask, rows) if bitmask is not None else logits
    t_rows = None if rows is None else torch.tensor(rows, dtype=torch.int64)
    sampling = build(params, "cpu")
    got = sample_triton(logits.clone(), bitmask, sampling, t_rows)
    mine = sample_torch(masked.clone(), sampling)
    for r, p in enumerate(params):
        token, logprob, fragile = sample_row(masked[r].double().numpy(), p)
        if not fragile:
            assert got.tokens[r].item() == token, (r, got.tokens[r].item(), token, p)
        # Triton and the torch path share float32 arithmetic: they agree even on fragile rows,
        # up to the last bit of a transcendental (numpy's log vs torch's).
        assert got.tokens[r].item() == mine.tokens[r].item(), (r, p)
        if token >= 0:
            assert math.isclose(got.logprobs[r].item(), logprob, rel_tol=1e-4, abs_tol=1e-4)


@SETTINGS
@given(case=sample_cases())
def check_sample(case):
    compare(*case)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(params=st.lists(row_params, min_size=3, max_size=3), seed=st.integers(0, 2**32 - 1))
def check_sample_across_chunks(params, seed):
    # Several programs per row: the cross-chunk combine (max, sum, first-index argmax) is used.
    rng = np.random.default_rng(seed)
    vocab = 3000
    logits = torch.from_numpy(rng.standard_normal((3, vocab)).astype(np.float32) * 3)
    bits = rng.random((2, 3008)) < 0.5  # 94 words; the last 8 bits name no token
    bitmask = torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy())
    compare(logits, bitmask, [2, 0], params)


if __name__ == "__main__":
    for check in (check_apply, check_sample, check_sample_across_chunks):
        check()
        print(f"{check.__name__}: ok", flush=True)
    greedy_tie = torch.tensor([[1.0] * 2500])  # ties across chunks: the lowest id must win
    result = sample_triton(greedy_tie, None, build([RowParams(0.0)], "cpu"))
    assert result.tokens.tolist() == [0], result
    print("all Triton interpreter checks passed")
