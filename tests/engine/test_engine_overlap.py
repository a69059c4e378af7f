"""Overlap scheduling (`engine.overlap`) changes when things run, never what is sampled: greedy
and seeded outputs equal those of the synchronous loop, constrained or not, with jump-forward,
chunked prefill, the prefix cache, n > 1 and an abort in between; every KV slot comes back.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from engine_helpers import chat, make_engine

from corral.engine import SamplingParams
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
QUESTIONS = ["Describe a person as JSON.", "What is the capital of France?", "Count to five."]


def settled(eng) -> None:
    eng.check_integrity()
    assert not eng.live_sequences()
    assert eng.cache.radix.protected_size == 0
    assert not eng.has_unfinished()


@pytest.fixture(scope="module")
def person(smollm2):
    info = TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=smollm2.eos_token_ids
    )
    return compile_constraint(ConstraintSpec.json_schema(PERSON), info)


def both(model, prompts, params, constraints, **config):
    """The outputs without overlap and with it; the overlapped engine's counters."""
    got = []
    for overlap in (False, True):
        eng = make_engine(model, overlap=overlap, **config)
        got.append(eng.generate(prompts, params, constraints))
        settled(eng)
        eng.close()
    return *got, eng.counters


def test_overlap_gives_the_same_greedy_outputs_with_jump_forward(smollm2, person):
    prompts = [chat(smollm2, q) for q in QUESTIONS] + [chat(smollm2, "A person, as JSON.")]
    constraints = [person, None, None, person]
    params = SamplingParams(max_tokens=40, temperature=0)
    # a 64-token step budget: chunked prefills run beside decodes
    sync, overlapped, counters = both(smollm2, prompts, params, constraints, max_batched_tokens=64)
    assert counters["forced_tokens"] > 0  # jump-forward ran beside overlap
    for a, b in zip(sync, overlapped, strict=True):
        assert a[0].token_ids == b[0].token_ids
        assert a[0].finish_reason == b[0].finish_reason
    done = [
        c[0]
        for c, k in zip(overlapped, constraints, strict=True)
        if k and c[0].finish_reason == "stop"
    ]
    assert done, "no constrained output finished: the check is too weak"
    for c in done:
        jsonschema.validate(json.loads(c.text), PERSON)


# Free text, then forced text that is one token or the start of a longer one (`":` or `":"`: the
# value may be a string), then free text again: the draft of `":` is made while the sequence
# decodes one token a step, in the postprocessing of a step whose successor is already scheduled.
KEY_THEN_VALUE = r'\{"name":"[A-Za-z]{1,16}","(age|tags)":("[a-z]{1,8}"|[0-9]{1,3})\}'


def test_overlap_drops_the_draft_made_for_a_step_already_scheduled(smollm2):
    """The draft made after step n's token, while n+1 is already scheduled, must not ride on
    n+2: n+2 feeds it after n+1's token, and n+2's postprocessing verified the draft made after
    n+1's token instead (the KV of the fed draft token was kept as if accepted; later the
    sequence had nothing to extend: "sequence extends by 0 tokens")."""
    info = TokenizerInfo.from_hf(
        smollm2.tokenizer, vocab_size=smollm2.vocab_size, eos_token_ids=smollm2.eos_token_ids
    )
    regex = compile_constraint(ConstraintSpec.regex(KEY_THEN_VALUE), info)
    params = SamplingParams(max_tokens=40, temperature=0)
    sync, overlapped, _ = both(smollm2, [chat(smollm2, "A person, as JSON.")], params, [regex])
    assert sync[0][0].token_ids == overlapped[0][0].token_ids
    out = overlapped[0][0]
    assert out.finish_reason == "stop"
    # the key was followed by a number: `":` was drafted where `":"` could also have come
    assert re.fullmatch(r'\{"name":"[A-Za-z]+","(age|tags)":[0-9]+\}', out.text), out.text


def test_overlap_seeded_n_choices_and_stop_strings(tiny_model):
    prompts = [chat(tiny_model, q) for q in QUESTIONS]
    params = SamplingParams(
        max_tokens=12, temperature=0.9, seed=3, n=2, stop=("e",), presence_penalty=0.5
    )
    sync, overlapped, _ = both(tiny_model, prompts, params, None)
    for a, b in zip(sync, overlapped, strict=True):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        assert [c.text for c in a] == [c.text for c in b]


def test_overlap_abort_mid_flight_frees_everything(tiny_model):
    eng = make_engine(tiny_model, overlap=True)
    keep = eng.add_request(chat(tiny_model, "Hi"), SamplingParams(max_tokens=8, temperature=0))
    gone = eng.add_request(chat(tiny_model, "Bye"), SamplingParams(max_tokens=50, temperature=0))
    for _ in range(3):
        eng.step()
    eng.abort(gone)  # its step is still in flight
    results = eng.run_until_done()
    assert results[keep][0].finish_reason == "length"
    settled(eng)
    eng.close()
