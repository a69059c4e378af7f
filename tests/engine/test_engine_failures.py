"""Failure semantics and fault isolation of the synchronous engine, through real code.

A matcher driven into llguidance's error state mid-request (CORRAL_LLG_LIMITS), a constraint
compiled for another tokenizer, faults raised inside a step (CORRAL_FAULTS): the affected
sequence ends with finish reason "error" and the documented `EngineFailure`, the others in the
same batch are unaffected (their outputs equal a run without the fault, or validate with
jsonschema), and every KV slot is back afterwards.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from engine_helpers import chat, make_engine
from limit_schemas import MID_GENERATION, MID_GENERATION_LIMITS

from corral.engine import Engine, EngineConfig, RequestError, SamplingParams
from corral.engine.serving.core import EngineFailure
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

GREEDY = SamplingParams(max_tokens=12, temperature=0)

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "pop": {"type": "integer"}},
    "required": ["city", "pop"],
    "additionalProperties": False,
}


def settled(eng: Engine) -> None:
    """Nothing running, every slot free or in the tree exactly once, nothing locked."""
    eng.check_integrity()
    assert not eng.live_sequences()
    assert eng.pool.num_free + eng.cache.radix.total_size == eng.pool.capacity
    assert eng.cache.radix.protected_size == 0


@pytest.mark.parametrize("jump_forward", [True, False])
def test_matcher_in_error_mid_request_fails_only_that_request(
    smollm2, tokinfo, monkeypatch, jump_forward
):
    city = compile_constraint(ConstraintSpec.json_schema(CITY), tokinfo)
    monkeypatch.setenv("CORRAL_LLG_LIMITS", MID_GENERATION_LIMITS)
    nested = compile_constraint(ConstraintSpec.json_schema(MID_GENERATION), tokinfo)
    prompts = [chat(smollm2, q) for q in ("A city as JSON.", "A person as JSON.", "A town.")]
    eng = make_engine(smollm2, jump_forward=jump_forward)
    params = SamplingParams(max_tokens=40, temperature=0)
    got = eng.generate(prompts, params, [city, nested, city])
    failed = got[1][0]
    assert failed.finish_reason == "error"
    assert failed.error.code == "constraint_failed"
    assert "max is 40" in failed.error.message
    assert "<grammar>" not in failed.error.message  # the first line only, not the backend dump
    assert failed.text.startswith('{"name":')  # it got past the first masks
    for ok in (got[0][0], got[2][0]):
        assert ok.finish_reason == "stop" and ok.error is None
        jsonschema.validate(json.loads(ok.text), CITY)
    assert eng.counters["failed"] == 1
    settled(eng)


def test_constraint_for_another_tokenizer_is_a_request_error(smollm2, tokinfo, llama3_tokenizer):
    # Llama-3's 128,256 tokens: masks of the wrong width.
    foreign = compile_constraint(ConstraintSpec.json_schema(CITY), llama3_tokenizer)
    # Same vocabulary and tokenizer, other EOS ids: only the fingerprint tells them apart.
    other_eos = TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=[0]
    )
    lookalike = compile_constraint(ConstraintSpec.json_schema(CITY), other_eos)
    mine = compile_constraint(ConstraintSpec.json_schema(CITY), tokinfo)
    prompt = chat(smollm2, "A city as JSON.")

    checked = make_engine(smollm2, jump_forward=False)
    checked.tokenizer_fingerprint = tokinfo.fingerprint
    for bad in (foreign, lookalike):
        with pytest.raises(RequestError, match="another tokenizer"):
            checked.add_request(prompt, GREEDY, bad)
    plain = Engine(smollm2, EngineConfig(num_threads=1), tokenizer_fingerprint=None)
    with pytest.raises(RequestError, match="49152"):
        plain.add_request(prompt, GREEDY, foreign)  # the width alone gives it away
    for eng in (checked, plain):
        assert not eng.scheduler.waiting and not eng._requests
        got = eng.generate([prompt], SamplingParams(max_tokens=40, temperature=0), [mine])
        assert got[0][0].finish_reason == "stop"
        jsonschema.validate(json.loads(got[0][0].text), CITY)
        settled(eng)


def test_seq_fault_fails_only_that_sequence(smollm2, tokinfo):
    prompts = [chat(smollm2, q) for q in ("Name a color.", "Name a fruit.", "Name a tree.")]
    city = compile_constraint(ConstraintSpec.json_schema(CITY), tokinfo)
    constraints = [None, city, None]
    ref = make_engine(smollm2).generate(prompts, GREEDY, constraints)
    eng = make_engine(smollm2, faults="seq@2")  # step 2: the first decode is prompt 0's
    got = eng.generate(prompts, GREEDY, constraints)
    assert got[0][0].finish_reason == "error"
    assert got[0][0].error.code == "sequence_failed"
    assert "seq@2" in got[0][0].error.message
    for i in (1, 2):
        assert got[i][0].error is None
        assert got[i][0].token_ids == ref[i][0].token_ids
        assert got[i][0].finish_reason == ref[i][0].finish_reason
    assert eng.faults.fired and not eng.faults
    settled(eng)


def test_mask_fault_fails_only_that_sequence(smollm2, tokinfo):
    prompts = [chat(smollm2, q) for q in ("A city as JSON.", "Name a fruit.", "A town as JSON.")]
    city = compile_constraint(ConstraintSpec.json_schema(CITY), tokinfo)
    constraints = [city, None, city]
    params = SamplingParams(max_tokens=40, temperature=0)
    ref = make_engine(smollm2).generate(prompts, params, constraints)
    eng = make_engine(smollm2, faults="mask@2")  # on the mask thread, prompt 0's fill
    got = eng.generate(prompts, params, constraints)
    assert got[0][0].finish_reason == "error"
    assert got[0][0].error.code == "sequence_failed"
    assert "mask@2" in got[0][0].error.message
    for i in (1, 2):
        assert got[i][0].error is None
        assert got[i][0].token_ids == ref[i][0].token_ids
    jsonschema.validate(json.loads(got[2][0].text), CITY)
    settled(eng)


def test_step_fault_propagates_and_reset_frees_everything(smollm2):
    prompts = [chat(smollm2, q) for q in ("Name a color.", "Count to five.")]
    eng = make_engine(smollm2, faults="step@3")
    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=20, temperature=0, n=2))
    eng.step()
    eng.step()
    with pytest.raises(RuntimeError, match="step@3"):
        eng.step()  # after scheduling: slots were grown for the step that never ran
    outs = eng.fail_all(EngineFailure("engine_restarted", "test"))
    assert len(outs) == 4
    assert all(o.finish_reason == "error" and o.error.code == "engine_restarted" for o in outs)
    eng.reset()
    settled(eng)
    again = eng.generate([prompts[0]], GREEDY)[0][0]
    assert again.finish_reason in ("stop", "length")
    settled(eng)


def test_n_choices_are_all_or_nothing_when_add_request_fails(smollm2, tokinfo):
    city = compile_constraint(ConstraintSpec.json_schema(CITY), tokinfo)

    class SecondMatcherFails:
        """Fault injection: the real compiled constraint, whose second matcher() raises."""

        tokenizer_fingerprint = city.tokenizer_fingerprint
        native = city.native

        def __init__(self) -> None:
            self.calls = 0

        def matcher(self):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("matcher construction failed")
            return city.matcher()

    eng = make_engine(smollm2)
    prompt = chat(smollm2, "A city as JSON.")
    with pytest.raises(RuntimeError, match="matcher construction"):
        eng.add_request(prompt, SamplingParams(max_tokens=8, n=3), SecondMatcherFails())
    assert not eng.scheduler.waiting and not eng._requests and not eng.has_unfinished()
    got = eng.generate([prompt], SamplingParams(max_tokens=40, temperature=0, n=2), [city])[0]
    assert [c.finish_reason for c in got] == ["stop", "stop"]
    settled(eng)


def test_fault_specs_parse_and_come_from_the_environment(monkeypatch):
    from corral.engine.serving.faults import Faults, parse_faults

    assert parse_faults(" step@3, seq@1 ") == parse_faults("step@3,seq@1")
    assert [f.kind for f in parse_faults("mask@2,step@1")] == ["mask", "step"]
    for bad in ("step", "step@0", "boom@2", "seq@x"):
        with pytest.raises(ValueError, match="CORRAL_FAULTS"):
            EngineConfig(faults=bad)
    monkeypatch.setenv("CORRAL_FAULTS", "seq@4")
    faults = Faults.from_config(None)
    assert faults
    faults.fire("seq", 3)  # not armed: nothing happens
    with pytest.raises(RuntimeError, match="seq@4"):
        faults.fire("seq", 4)
    faults.fire("seq", 4)  # fires once
    assert not faults and not Faults.from_config("")  # an explicit config wins over the env
