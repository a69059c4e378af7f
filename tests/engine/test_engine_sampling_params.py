"""Sampling parameters on the real model: repetition_penalty, min_tokens, top_k, min_p,
ignore_eos, and finite logprobs under a constraint.

Expected tokens come from a direct forward pass with the formula applied by hand, or from
another run of the same model; nothing is hard-coded.
"""

from __future__ import annotations

import math

import pytest
import torch
from engine_helpers import chat, make_engine

from corral.engine import Engine, RequestError, SamplingParams
from corral.engine.execution.batch import ForwardBatch
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

EOS = 2  # SmolLM2's <|im_end|>


def settled(eng: Engine) -> None:
    eng.check_integrity()
    assert not eng.live_sequences()


def greedy(model, prompt, **kw):
    eng = make_engine(model)
    got = eng.generate([prompt], SamplingParams(temperature=0, **kw))[0][0]
    settled(eng)
    return got


@pytest.fixture(scope="module")
def short(smollm2):
    """A prompt whose greedy answer ends with EOS after about a dozen tokens, and that answer."""
    prompt = chat(smollm2, "What is 2+2?")
    ref = greedy(smollm2, prompt, max_tokens=30)
    assert ref.finish_reason == "stop" and ref.token_ids[-1] == EOS
    return prompt, ref


def next_logits(model, ids: list[int]) -> torch.Tensor:
    pool = model.runner.make_kv_pool(len(ids) + 1)
    batch = ForwardBatch.from_sequences([ids], [torch.arange(1, len(ids) + 1)])
    return model.runner.forward(batch, pool)[0].clone()


def test_repetition_penalty_follows_the_vllm_formula(smollm2):
    prompt = chat(smollm2, "Name a color.")
    rp = 1.3
    got = greedy(smollm2, prompt, max_tokens=3, repetition_penalty=rp)
    plain = greedy(smollm2, prompt, max_tokens=3)
    assert got.token_ids != plain.token_ids  # the penalty matters here
    for k in range(3):
        ids = prompt + got.token_ids[:k]
        logits = next_logits(smollm2, ids)
        seen = torch.tensor(sorted(set(ids)))
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / rp, vals * rp)
        assert got.token_ids[k] == int(logits.argmax()), f"position {k}"


def test_min_tokens_masks_eos_and_stop_tokens(smollm2, short):
    prompt, ref = short
    n = len(ref.token_ids)
    got = greedy(smollm2, prompt, max_tokens=n + 8, min_tokens=n + 4)
    assert len(got.token_ids) >= n + 4
    assert EOS not in got.token_ids[: n + 4]
    assert got.token_ids[: n - 1] == ref.token_ids[: n - 1]  # the same until the EOS was due
    stop_tok = ref.token_ids[1]
    early = greedy(smollm2, prompt, max_tokens=8, stop_token_ids=(stop_tok,))
    assert early.token_ids == ref.token_ids[:2] and early.finish_reason == "stop"
    late = greedy(smollm2, prompt, max_tokens=8, stop_token_ids=(stop_tok,), min_tokens=4)
    assert stop_tok not in late.token_ids[:4]


def test_stop_strings_do_not_end_the_output_before_min_tokens(smollm2, short):
    prompt, ref = short
    word = smollm2.tokenizer.decode(ref.token_ids[1:2]).strip()  # in the text at token 1
    cut = greedy(smollm2, prompt, max_tokens=12, stop=(word,))
    assert cut.finish_reason == "stop" and len(cut.token_ids) <= 2
    got = greedy(smollm2, prompt, max_tokens=12, stop=(word,), min_tokens=5)
    assert len(got.token_ids) >= 5
    assert got.text.startswith(ref.text[: ref.text.index(word) + len(word)])


@pytest.mark.parametrize("jump_forward", [True, False])
def test_min_tokens_yields_to_a_grammar_that_must_end(smollm2, jump_forward):
    tok = TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=smollm2.eos_token_ids
    )
    paris = compile_constraint(ConstraintSpec.choice(["Paris"]), tok)
    eng = make_engine(smollm2, jump_forward=jump_forward)
    params = SamplingParams(max_tokens=20, temperature=0, min_tokens=10)
    got = eng.generate([chat(smollm2, "Capital of France?")], params, [paris])[0][0]
    assert got.text == "Paris" and got.finish_reason == "stop"
    assert len(got.token_ids) < 10  # the grammar allowed only EOS: it wins (documented)
    settled(eng)


def test_top_k_and_min_p_filter_like_greedy_at_their_extremes(smollm2):
    prompt = chat(smollm2, "Name a color.")
    ref = greedy(smollm2, prompt, max_tokens=8)
    hot = dict(max_tokens=8, temperature=1.5, seed=3)
    eng = make_engine(smollm2)
    free, top1, minp1 = (
        eng.generate([prompt], SamplingParams(**extra, **hot))[0][0]
        for extra in ({}, {"top_k": 1}, {"min_p": 1.0})
    )
    assert free.token_ids != ref.token_ids  # the temperature alone does change the output
    assert top1.token_ids == ref.token_ids
    assert minp1.token_ids == ref.token_ids
    settled(eng)


def test_ignore_eos_runs_to_max_tokens(smollm2, short):
    prompt, ref = short
    n = len(ref.token_ids)
    got = greedy(smollm2, prompt, max_tokens=n + 4, ignore_eos=True)
    assert got.finish_reason == "length" and len(got.token_ids) == n + 4
    assert got.token_ids[:n] == ref.token_ids  # EOS taken as a token, not as the end


def test_constrained_logprobs_are_finite_and_omit_masked_alternatives(smollm2):
    tok = TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=smollm2.eos_token_ids
    )
    cities = compile_constraint(ConstraintSpec.choice(["Paris", "London", "Berlin"]), tok)
    prompt = chat(smollm2, "Capital of France?")
    eng = make_engine(smollm2)
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=True, top_logprobs=5)
    constrained, free = eng.generate([prompt, prompt], params, [cities, None])
    lps = constrained[0].logprobs
    assert constrained[0].text in ("Paris", "London", "Berlin")
    assert len(lps) == len(constrained[0].token_ids)
    assert all(math.isfinite(lp.logprob) for lp in lps)
    assert all(math.isfinite(v) for lp in lps for _, v in lp.top)
    assert all(1 <= len(lp.top) <= 5 for lp in lps)
    assert min(len(lp.top) for lp in lps) < 5  # masked alternatives were left out
    forced = lps[-1]  # the last token of a choice is the only one its grammar allows
    assert forced.top == ((forced.token_id, pytest.approx(0.0, abs=1e-5)),)
    assert all(len(lp.top) == 5 for lp in free[0].logprobs)  # unconstrained: as many as asked
    settled(eng)


def test_new_parameters_are_validated():
    for bad in (dict(repetition_penalty=0), dict(repetition_penalty=-1.0), dict(min_tokens=-1)):
        with pytest.raises(RequestError):
            SamplingParams(**bad)
    assert SamplingParams(repetition_penalty=1.0).penalized is False
    assert SamplingParams(repetition_penalty=1.2).penalized is True
