"""sample() against the plain reference; masks are never violated; frequencies pass a chi-square.

Tokens must equal the reference's exactly, except on rows the reference flags as *fragile*: the
float64 reference and the float32 kernels could legitimately disagree there (two Gumbel scores
within 1e-4, a top-p cumulative mass within 1e-5 of top_p, a logit within 1e-5 of the min-p
threshold). Logprobs agree to float32 rounding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mask_kernels_reference import (
    RowParams,
    allowed_tokens,
    apply_reference,
    chi2_sf,
    distribution,
    sample_row,
)

from corral.mask_kernels import SamplingTensors, sample

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]
SIGNIFICANCE = 1e-3  # chi-square: reject the sampler if p < 0.001 (fixed seeds, so deterministic)


def build(params: list[RowParams], device: str) -> SamplingTensors:
    return SamplingTensors.build(
        temperature=[p.temperature for p in params],
        top_k=[p.top_k for p in params],
        top_p=[p.top_p for p in params],
        min_p=[p.min_p for p in params],
        seed=[p.seed for p in params],
        offset=[p.offset for p in params],
        device=device,
    )


def check_against_reference(logits, bitmask, rows, params, device) -> int:
    """Sample on ``device``, compare every row with the reference; returns #fragile rows."""
    masked = apply_reference(logits, bitmask, rows) if bitmask is not None else logits
    reference = [sample_row(masked[r].double().numpy(), p) for r, p in enumerate(params)]
    t_rows = None if rows is None else torch.tensor(rows, dtype=torch.int64, device=device)
    got = sample(
        logits.to(device),
        None if bitmask is None else bitmask.to(device),
        build(params, device),
        t_rows,
    )
    tokens, logprobs = got.tokens.cpu().tolist(), got.logprobs.cpu()
    fragile = 0
    for r, (token, logprob, is_fragile) in enumerate(reference):
        if is_fragile:
            fragile += 1
            continue
        assert tokens[r] == token, f"row {r}: got {tokens[r]}, reference {token}, {params[r]}"
        if token >= 0:
            assert math.isclose(logprobs[r].item(), logprob, rel_tol=1e-4, abs_tol=1e-4)
        else:
            assert logprobs[r].item() == -math.inf
    return fragile


row_params = st.builds(
    RowParams,
    temperature=st.sampled_from([0.0, -1.0, 0.3, 1.0, 1.7]) | st.floats(0.05, 4.0),
    top_k=st.sampled_from([0, 0, 1, 2, 5, 50]),
    top_p=st.sampled_from([1.0, 1.0, 0.95, 0.5, 0.1]) | st.floats(0.01, 1.0),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.3, 1.0]),
    seed=st.integers(-(2**63), 2**63 - 1),
    offset=st.integers(0, 2**40),
)


@st.composite
def sample_cases(draw):
    batch = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 200))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        values = rng.standard_normal((batch, vocab)) * draw(st.sampled_from([0.5, 3.0, 20.0]))
    else:  # few distinct values: ties everywhere
        values = rng.integers(-3, 3, size=(batch, vocab)).astype(np.float64)
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    logits = torch.from_numpy(values).to(dtype)
    bitmask, rows = None, None
    if draw(st.booleans()):
        rows = draw(st.permutations(range(batch)))[: draw(st.integers(0, batch))]
        rows = None if draw(st.booleans()) else list(rows)
        n = batch if rows is None else len(rows)
        words = draw(st.integers(max(1, -(-vocab // 32) - 1), -(-vocab // 32)))
        sparse = draw(st.booleans())
        bits = rng.random((n, 32 * words)) < (0.05 if sparse else 0.6)
        packed = np.packbits(bits, axis=1, bitorder="little").view(np.int32)
        bitmask = torch.from_numpy(packed.copy())
    params = [draw(row_params) for _ in range(batch)]
    return logits, bitmask, rows, params


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=sample_cases())
def test_sample_matches_reference(device, case):
    logits, bitmask, rows, params = case
    check_against_reference(logits, bitmask, rows, params, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [128256, 151936])
def test_sample_real_vocab(device, vocab):
    rng = np.random.default_rng(vocab)
    logits = torch.from_numpy(rng.standard_normal((6, vocab)).astype(np.float32) * 4)
    bits = rng.random((4, vocab)) < 0.3
    bits[3] = False
    bits[3, [17, 90_001, vocab - 1]] = True  # a grammar that leaves three tokens
    bitmask = torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy())
    params = [
        RowParams(0.0),
        RowParams(0.8, top_k=40, seed=1),
        RowParams(1.0, top_p=0.9, seed=2),
        RowParams(1.2, min_p=0.05, seed=3),
        RowParams(1.0, seed=4, offset=9),
        RowParams(0.7, top_k=10, top_p=0.5, min_p=0.1, seed=5),
    ]
    assert check_against_reference(logits, bitmask, [0, 2, 4, 5], params, device) == 0


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(case=sample_cases())
def test_sampled_tokens_are_allowed_and_kept(device, case):
    logits, bitmask, rows, params = case
    if bitmask is None:
        return
    masked = apply_reference(logits, bitmask, rows).double().numpy()
    t_rows = None if rows is None else torch.tensor(rows, dtype=torch.int64, device=device)
    got = sample(logits.to(device), bitmask.to(device), build(params, device), t_rows)
    targets = range(bitmask.shape[0]) if rows is None else rows
    for i, r in enumerate(targets):
        token = got.tokens[r].item()
        allowed = allowed_tokens(bitmask[i].numpy(), logits.shape[1])
        if not (allowed & np.isfinite(masked[r])).any():
            assert token == -1
            continue
        assert allowed[token], f"row {r} sampled disallowed token {token}"
        if params[r].temperature > 0:
            assert distribution(masked[r], params[r])[token] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_is_the_masked_argmax_first_on_ties(device):
    logits = torch.tensor([[5.0, 1.0, 3.0, 3.0, 9.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    bitmask = torch.tensor([[0b01110], [0b11010]], dtype=torch.int32)
    params = SamplingTensors.build([0.0, 0.0], top_k=[1, 0], top_p=[0.1, 1.0], device=device)
    got = sample(logits.to(device), bitmask.to(device), params)
    assert got.tokens.cpu().tolist() == [2, 1]
    expected = torch.log_softmax(torch.tensor([3.0, 3.0, 1.0]), 0)[0].item()
    assert math.isclose(got.logprobs[0].item(), expected, rel_tol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "params",
    [
        RowParams(1.3),
        RowParams(0.7, top_k=5),
        RowParams(1.0, top_p=0.8),
        RowParams(1.5, min_p=0.1),
        RowParams(0.9, top_k=6, top_p=0.9, min_p=0.02),
    ],
    ids=["temperature", "top_k", "top_p", "min_p", "all"],
)
def test_frequencies_pass_chi_square(device, params):
    draws = 20_000
    rng = np.random.default_rng(11)
    logits_row = rng.standard_normal(12).astype(np.float32) * 1.5
    bits = np.ones((1, 32), dtype=bool)
    bits[0, [2, 7]] = False
    bitmask = torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy())
    logits = torch.from_numpy(np.tile(logits_row, (draws, 1)))
    batch_mask = bitmask.expand(draws, -1).contiguous()
    sampling = SamplingTensors.build(
        temperature=[params.temperature] * draws,
        top_k=[params.top_k] * draws,
        top_p=[params.top_p] * draws,
        min_p=[params.min_p] * draws,
        seed=[1234] * draws,
        offset=list(range(draws)),
        device=device,
    )
    tokens = sample(logits.to(device), batch_mask.to(device), sampling).tokens.cpu().numpy()
    masked = apply_reference(torch.from_numpy(logits_row[None]), bitmask, None)[0].double().numpy()
    probs = distribution(masked, params)
    counts = np.bincount(tokens, minlength=12)
    assert counts[probs == 0].sum() == 0, "a token outside the filtered support was drawn"
    expected = probs[probs > 0] * draws
    observed = counts[probs > 0]
    small = expected < 5  # pool rare categories so the chi-square approximation holds
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    stat = float(((observed - expected) ** 2 / expected).sum())
    p_value = chi2_sf(stat, len(expected) - 1) if len(expected) > 1 else 1.0
    assert p_value > SIGNIFICANCE, f"chi2={stat:.1f}, df={len(expected) - 1}, p={p_value:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_tokens_whatever_the_batch(device):
    rng = np.random.default_rng(3)
    logits = torch.from_numpy(np.tile(rng.standard_normal((3, 5000)).astype(np.float32), (2, 1)))
    params = [RowParams(1.0, seed=s, offset=o, top_p=0.9) for s, o in [(1, 0), (1, 1), (2, 0)] * 2]
    first = sample(logits.clone().to(device), None, build(params, device)).tokens.cpu()
    again = sample(logits.clone().to(device), None, build(params, device)).tokens.cpu()
    assert torch.equal(first, again)
    assert torch.equal(first[:3], first[3:])  # identical rows with identical (seed, offset)
    alone = sample(logits[4:5].clone().to(device), None, build(params[4:5], device)).tokens.cpu()
    assert alone.item() == first[4].item()
    shuffled = [5, 2, 0, 4, 1, 3]
    permuted = sample(
        logits[shuffled].clone().to(device), None, build([params[i] for i in shuffled], device)
    ).tokens.cpu()
    assert permuted.tolist() == first[shuffled].tolist()
