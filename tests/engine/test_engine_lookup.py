"""Prompt-lookup speculation on the real default model: outputs identical with it on and off
(greedy, and seeded sampling too, since draws are fixed by (seed, output position)), across
constrained and unconstrained requests, jump-forward, budget closing, stop strings, a reasoning
budget and n > 1; proposals cut where the grammar refuses; adaptive k; the request's opt-out.

The reference for every output is the same engine with `speculative=False`; every engine checks
its KV bookkeeping afterwards. Engines run on one torch thread (the test machine is small).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from engine_helpers import chat, make_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.engine import SamplingParams
from corral.engine.constrained.jump_forward import accepted_after
from corral.engine.constrained.lookup import LookupIndex, SpecState
from corral.engine.serving.core import ReasoningBudget, Sequence
from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.core.runtime import BudgetClose

DOC = (
    "Bug report #4821\n"
    "Title: Crash when exporting large spreadsheets to PDF\n"
    "Reporter: Margaret Okonkwo-Lindqvist (m.okonkwo@fernwood-labs.example)\n"
    "Component: export/pdf-renderer\n"
    "Version: 3.14.2-beta\n"
    "Steps: open quarterly_revenue_2024.xlsx, choose File > Export > PDF, press Save.\n"
    "Expected: a PDF named quarterly_revenue_2024.pdf in the Downloads folder.\n"
    "Actual: the application freezes for ten seconds and closes without a message.\n"
)
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "reporter": {"type": "string"},
        "email": {"type": "string"},
        "component": {"type": "string"},
        "version": {"type": "string"},
    },
    "required": ["title", "reporter", "email", "component", "version"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engines(smollm2):
    """(speculation on, off): shared by the tests of this module (their counters grow)."""
    on, off = make_engine(smollm2), make_engine(smollm2, speculative=False)
    yield on, off
    on.close()
    off.close()


@pytest.fixture(scope="module")
def bug_schema(tokinfo):
    return compile_constraint(ConstraintSpec.json_schema(SCHEMA), tokinfo)


def extraction(model, ask: str = "Extract the report's fields as JSON.") -> list[int]:
    return chat(model, DOC + "\n" + ask)


def run_both(engines, prompts, params, constraints=None):
    """Each engine's choices for the same requests, plus the lookup tokens the run accepted."""
    on, off = engines
    before = on.stats()["lookup_draft_accepted"]
    got_on = on.generate(prompts, params, constraints)
    got_off = off.generate(prompts, params, constraints)
    for eng in (on, off):
        eng.check_integrity()
        assert not eng.live_sequences()
    assert off.stats()["lookup_draft_tokens"] == 0
    return got_on, got_off, on.stats()["lookup_draft_accepted"] - before


def assert_same(got_on, got_off) -> None:
    for req_on, req_off in zip(got_on, got_off, strict=True):
        for a, b in zip(req_on, req_off, strict=True):
            assert a.token_ids == b.token_ids
            assert a.text == b.text
            assert a.finish_reason == b.finish_reason


def test_constrained_extraction_is_identical_and_accepts_lookups(smollm2, engines, bug_schema):
    params = SamplingParams(max_tokens=160, temperature=0)
    on, off, accepted = run_both(engines, [extraction(smollm2)], params, [bug_schema])
    assert_same(on, off)
    (choice,) = on[0]
    jsonschema.validate(json.loads(choice.text), SCHEMA)
    assert accepted > 5  # the copied spans were drafted and confirmed
    assert choice.spec_proposed >= choice.spec_accepted > 0


def test_unconstrained_copying_is_identical_and_accepts_lookups(smollm2, engines):
    prompt = extraction(smollm2, "Repeat the bug report above word for word.")
    params = SamplingParams(max_tokens=120, temperature=0)
    on, off, accepted = run_both(engines, [prompt], params)
    assert_same(on, off)
    assert accepted > 5


@pytest.mark.parametrize("n", [1, 3])
def test_seeded_sampling_is_reproducible_and_identical(smollm2, engines, bug_schema, n):
    """Draws are fixed by (seed, output position): a verified draft changes none of them."""
    prompt = extraction(smollm2)
    params = SamplingParams(max_tokens=60, temperature=0.7, top_p=0.95, seed=1234, n=n)
    on, off, _ = run_both(engines, [prompt, prompt], params, [bug_schema, None])
    assert_same(on, off)
    again, _, _ = run_both(engines, [prompt, prompt], params, [bug_schema, None])
    assert_same(on, again)


def test_batch_of_mixed_requests_with_a_small_step_budget(smollm2, engines, bug_schema):
    """Greedy, n > 1, constrained and not, in one batch; drafts compete for the step's budget."""
    on_eng, _ = engines
    prompts = [extraction(smollm2), extraction(smollm2, "Summarize the report.")]
    params = SamplingParams(max_tokens=80, temperature=0, n=2)
    on, off, accepted = run_both(engines, prompts, params, [bug_schema, None])
    assert_same(on, off)
    assert accepted > 0
    small = make_engine(smollm2, max_step_draft_tokens=3, max_batched_tokens=64)
    got = small.generate(prompts, params, [bug_schema, None])
    small.check_integrity()
    assert_same(got, off)


def test_stop_string_inside_a_copied_span_cuts_exactly(smollm2, engines):
    """A draft that runs past a stop string: the output is cut where it is without drafts."""
    prompt = extraction(smollm2, "Repeat the bug report above word for word.")
    for stop in ("Fernwood", "-labs", "Version:"):
        params = SamplingParams(max_tokens=70, temperature=0, stop=(stop,))
        on, off, _ = run_both(engines, [prompt], params)
        assert_same(on, off)
        assert stop not in on[0][0].text


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 23])
def test_drafts_never_pass_max_tokens(smollm2, engines, bug_schema, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    prompt = extraction(smollm2, "Repeat the bug report above word for word.")
    on, off, _ = run_both(engines, [prompt, prompt], params, [None, bug_schema])
    assert_same(on, off)
    assert all(len(c.token_ids) <= max_tokens for r in on for c in r)


@pytest.mark.parametrize("max_tokens", [12, 30, 45])
def test_budget_closing_is_identical(smollm2, engines, tokinfo, bug_schema, max_tokens):
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(SCHEMA))
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, budget_close=BudgetClose(closer, tokinfo)
    )
    on, off, _ = run_both(engines, [extraction(smollm2)], params, [bug_schema])
    assert_same(on, off)
    (choice,) = on[0]
    assert choice.budget_close == off[0][0].budget_close
    if choice.budget_close is None or choice.budget_close.complete:  # 12 is below the shortest
        jsonschema.validate(json.loads(choice.text), SCHEMA)
    assert (max_tokens >= 30) == (choice.budget_close is None or choice.budget_close.complete)


@pytest.mark.parametrize("budget", [0, 5, 17])
def test_reasoning_budget_is_identical(smollm2, engines, budget):
    prompt = extraction(smollm2, "Repeat the bug report above word for word.")
    params = SamplingParams(
        max_tokens=60, temperature=0, reasoning_budget=ReasoningBudget(budget, "</think>")
    )
    on, off, _ = run_both(engines, [prompt], params)
    assert_same(on, off)
    ids = on[0][0].token_ids  # the budget closed the block where it would without drafts
    assert smollm2.tokenizer.decode(ids[budget:]).startswith("</think>")


def test_request_opt_out_proposes_nothing(smollm2, engines, bug_schema):
    on_eng, _ = engines
    before = on_eng.stats()["lookup_draft_tokens"]
    params = SamplingParams(max_tokens=60, temperature=0, speculative=False)
    (choice,) = on_eng.generate([extraction(smollm2)], params, [bug_schema])[0]
    assert on_eng.stats()["lookup_draft_tokens"] == before
    assert choice.spec_proposed == 0


def test_a_proposal_is_cut_where_the_grammar_refuses(smollm2, tokinfo):
    """The grammar takes 'version' digits only: a proposal copying '3.14.2-beta' is cut at
    the '-', and the matcher is left exactly where it was."""
    tok = smollm2.tokenizer
    pattern = r'\{"version": "[0-9.]+"\}'
    constraint = compile_constraint(ConstraintSpec.regex(pattern), tokinfo)
    prompt = tok.encode("Version: 3.14.2-beta\n", add_special_tokens=False)
    seq = Sequence("r", 0, prompt, SamplingParams(), seed=0, matcher=constraint.matcher())
    for t in tok.encode('{"version": "3.', add_special_tokens=False):
        assert seq.matcher.accept(t)
        seq.output_ids.append(t)
    index = LookupIndex(1, 4)
    proposal = index.propose(seq, [], 8)
    text = tok.decode(proposal)
    assert "-beta" in text  # what follows '3.' in the prompt
    before = seq.matcher.forced_continuation(), seq.matcher.can_terminate()
    ok = accepted_after(seq, [], proposal)
    assert 0 < ok < len(proposal)
    assert "-" not in tok.decode(proposal[:ok]) and "-" in tok.decode(proposal[: ok + 1])
    assert (seq.matcher.forced_continuation(), seq.matcher.can_terminate()) == before
    for t in proposal[:ok]:  # the kept prefix is still accepted from the unchanged state
        assert seq.matcher.accept(t)


def test_adaptive_k_follows_acceptance_and_cost():
    s = SpecState()
    assert s.allowance(8, 0.5) == 1  # the prior tries one token where rows cost half a pass
    assert s.allowance(8, 0.05) > 1  # more where rows are nearly free
    for _ in range(6):
        s.settle(4, 4)
    assert s.allowance(8, 0.5) >= 3  # a sequence that keeps copying drafts more
    for _ in range(2):
        s.settle(s.allowance(8, 0.5) or 1, 0)
    assert s.allowance(8, 0.5) < 3
    s.settle(1, 0)  # three misses in a row: off for a cooldown, then a 1-token probe
    waits = 0
    while s.allowance(8, 0.5) == 0:
        waits += 1
    assert waits >= 8
    s.settle(1, 0)  # a failed probe: off again, for longer
    longer = 0
    while s.allowance(8, 0.5) == 0:
        longer += 1
    assert longer > waits
    assert s.allowance(8, 0.05) == 1  # still probing (a cooldown ran out)
    for _ in range(6):
        s.settle(1, 1)  # good probes turn it back on
    assert s.allowance(8, 0.5) >= 1 and s.misses == 0


NAMES = st.sampled_from(["Alder", "Birchwood", "Castellan", "Dunmore", "Everett", "Ferreira"])
WORDS = st.lists(
    st.sampled_from(["blue", "engine", "harbour", "quarterly", "signal", "ledger", "north"]),
    min_size=1,
    max_size=4,
).map(" ".join)


@st.composite
def documents(draw):
    """A schema of 2-4 fields and a document that states each field's value."""
    keys = draw(st.lists(st.sampled_from(["name", "city", "item", "code", "note"]), min_size=2,
                         max_size=4, unique=True))  # fmt: skip
    props, lines = {}, []
    for key in keys:
        kind = draw(st.sampled_from(["string", "integer", "enum"]))
        if kind == "integer":
            value = draw(st.integers(0, 99999))
            props[key] = {"type": "integer"}
        elif kind == "enum":
            value = draw(NAMES)
            props[key] = {"enum": [value, "none"]}
        else:
            value = f"{draw(NAMES)} {draw(WORDS)}"
            props[key] = {"type": "string"}
        lines.append(f"{key.capitalize()}: {value}")
    schema = {"type": "object", "properties": props, "required": keys,
              "additionalProperties": False}  # fmt: skip
    return schema, "Record\n" + "\n".join(lines) + "\n" + "\n".join(lines[::-1])


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=documents())
def test_drawn_extractions_validate_and_match_the_plain_output(smollm2, engines, tokinfo, case):
    schema, doc = case
    constraint = compile_constraint(ConstraintSpec.json_schema(schema), tokinfo)
    prompt = chat(smollm2, doc + "\nExtract the record as JSON.")
    params = SamplingParams(max_tokens=120, temperature=0)
    on, off, _ = run_both(engines, [prompt], params, [constraint])
    assert_same(on, off)
    (choice,) = on[0]
    if choice.finish_reason == "stop":
        jsonschema.validate(json.loads(choice.text), schema)
