"""apply_bitmask_ against the plain reference: exact bits, every dtype, padding and row subsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mask_kernels_reference import allowed_tokens, apply_reference

from corral.mask_kernels import apply_bitmask_

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(INT_VIEW[a.dtype]).cpu(), b.view(INT_VIEW[b.dtype]).cpu())


def random_words(rng: np.random.Generator, rows: int, words: int, density: str) -> torch.Tensor:
    if density == "dense":
        w = rng.integers(0, 2**32, size=(rows, words), dtype=np.uint64)
    elif density == "none":
        w = np.zeros((rows, words), dtype=np.uint64)
    elif density == "all":
        w = np.full((rows, words), 2**32 - 1, dtype=np.uint64)
    else:  # a handful of allowed tokens, as a grammar usually leaves
        w = np.zeros((rows, words), dtype=np.uint64)
        for r in range(rows):
            for t in rng.integers(0, 32 * words, size=3):
                w[r, t // 32] |= np.uint64(1) << np.uint64(t % 32)
    return torch.from_numpy(w.astype(np.uint32).view(np.int32).copy())


@st.composite
def cases(draw):
    vocab = draw(st.integers(1, 300))
    words_needed = -(-vocab // 32)
    # The tokenizer's vocabulary may be smaller than the model's (fewer words), or the same.
    words = draw(st.integers(max(1, words_needed - 3), words_needed + 1))
    batch = draw(st.integers(1, 6))
    use_rows = draw(st.booleans())
    rows = draw(st.permutations(range(batch)))[: draw(st.integers(0, batch))]
    return dict(
        vocab=vocab,
        words=words,
        batch=batch,
        rows=list(rows) if use_rows else None,
        dtype=draw(st.sampled_from(DTYPES)),
        density=draw(st.sampled_from(["dense", "none", "all", "sparse"])),
        seed=draw(st.integers(0, 2**31)),
    )


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_apply_matches_reference(device, case):
    rng = np.random.default_rng(case["seed"])
    n_masks = case["batch"] if case["rows"] is None else len(case["rows"])
    bitmask = random_words(rng, n_masks, case["words"], case["density"]).to(device)
    logits = torch.from_numpy(rng.standard_normal((case["batch"], case["vocab"])))
    logits = logits.to(case["dtype"]).to(device)
    rows = None
    if case["rows"] is not None:
        rows = torch.tensor(case["rows"], dtype=torch.int64, device=device)
    expected = apply_reference(logits, bitmask, case["rows"])
    apply_bitmask_(logits, bitmask, rows)
    assert same_bits(logits, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("model_vocab", "tokenizer_vocab"),
    [(128256, 128256), (151936, 151665), (262144, 262144), (32000, 31990)],
)
def test_apply_real_vocab_sizes(device, model_vocab, tokenizer_vocab):
    rng = np.random.default_rng(model_vocab)
    words = -(-tokenizer_vocab // 32)
    bitmask = random_words(rng, 3, words, "dense").to(device)
    logits = torch.from_numpy(rng.standard_normal((4, model_vocab)).astype(np.float32)).to(device)
    rows = torch.tensor([3, 0, 2], device=device)
    original = logits.clone()
    expected = apply_reference(logits, bitmask, [3, 0, 2])
    apply_bitmask_(logits, bitmask, rows)
    assert same_bits(logits, expected)
    assert torch.equal(logits[1], original[1])  # an unconstrained row is untouched
    assert bool((logits[:, 32 * words :][[0, 2, 3]] == float("-inf")).all())


def test_apply_agrees_with_xgrammar_on_the_covered_vocabulary():
    xgr = pytest.importorskip("xgrammar")
    rng = np.random.default_rng(7)
    vocab = 128256
    bitmask = random_words(rng, 8, vocab // 32, "dense")
    for dtype in DTYPES:
        logits = torch.from_numpy(rng.standard_normal((8, vocab))).to(dtype)
        theirs = logits.clone()
        xgr.apply_token_bitmask_inplace(theirs, bitmask)
        apply_bitmask_(logits, bitmask)
        assert same_bits(logits, theirs)


def test_allowed_values_keep_exact_bits():
    special = torch.tensor([[float("nan"), -0.0, 0.0, float("inf"), -1e-38, 3.0]])
    bitmask = torch.tensor([[0b011011]], dtype=torch.int32)
    for dtype in DTYPES:
        logits = special.to(dtype)
        expected = logits.clone()
        apply_bitmask_(logits, bitmask)
        keep = torch.from_numpy(allowed_tokens(bitmask.numpy()[0], 6))
        assert same_bits(logits[0, keep], expected[0, keep])
        assert bool((logits[0, ~keep] == float("-inf")).all())


@pytest.mark.parametrize(
    ("logits", "bitmask", "rows", "message"),
    [
        (
            torch.zeros(2, 64, dtype=torch.float64),
            torch.zeros(2, 2, dtype=torch.int32),
            None,
            "float32",
        ),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int64), None, "int32"),
        (torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32), None, "rows="),
        (
            torch.zeros(2, 64),
            torch.zeros(1, 2, dtype=torch.int32),
            torch.tensor([0, 1]),
            "one entry",
        ),
        (torch.zeros(2, 64).t(), torch.zeros(64, 1, dtype=torch.int32), None, "contiguous"),
    ],
)
def test_apply_rejects_bad_arguments_with_a_reason(logits, bitmask, rows, message):
    with pytest.raises(ValueError, match=message):
        apply_bitmask_(logits, bitmask, rows)
