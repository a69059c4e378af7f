"""Jump-forward on the real default model: forced tokens, drafts verified in the prefill pass,
the bonus token, draft tokenization, and the learned boundary splits.

The reference for every output is the same engine with jump-forward off (token by token);
expected tokenizations come from the real tokenizer, never typed in by hand.

Engines run on one torch thread: the test machine is small and shared (results do not depend
on the thread count).
"""

from __future__ import annotations

import re

import pytest
import torch
from engine_helpers import chat, make_engine

from corral.engine import SamplingParams
from corral.engine.constrained.jump_forward import DraftHints, _tokenize_after
from corral.engine.kvcache.kv_pool import KVPool
from corral.grammar import ConstraintSpec, compile_constraint

PHONE = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"


@pytest.fixture(scope="module")
def phone(tokinfo):
    return compile_constraint(ConstraintSpec.regex(PHONE), tokinfo)


def both(model, prompts, params, constraints, **overrides):
    on = make_engine(model, jump_forward=True, **overrides)
    off = make_engine(model, jump_forward=False, **overrides)
    got = on.generate(prompts, params, constraints), off.generate(prompts, params, constraints)
    for eng in (on, off):
        eng.check_integrity()
        assert not eng.live_sequences()
    return got, on, off


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=20, temperature=0),
        SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=11, n=2),
    ],
    ids=["greedy", "seeded"],
)
def test_forced_tokens_skip_their_pass_and_change_nothing(smollm2, phone, params):
    prompts = [chat(smollm2, "What is the phone number of the town hall?")]
    (on, off), eng_on, eng_off = both(smollm2, prompts, params, [phone])
    for a, b in zip(on[0], off[0], strict=True):
        assert a.token_ids == b.token_ids  # RNG offsets advanced exactly as token by token
        assert re.fullmatch(PHONE, a.text)
    # "(", ")", " " and "-" are the only tokens allowed where they stand: no pass selects them.
    assert eng_on.counters["forced_tokens"] >= 2 * params.n
    passes = eng_on.counters["seq_forward_passes"]
    assert passes <= eng_off.counters["seq_forward_passes"] - eng_on.counters["forced_tokens"]


def test_logprob_requests_take_the_exact_path(smollm2, phone):
    prompts = [chat(smollm2, "What is the phone number of the town hall?")]
    params = SamplingParams(max_tokens=20, temperature=0, logprobs=True, top_logprobs=2)
    (on, off), eng_on, _ = both(smollm2, prompts, params, [phone])
    assert eng_on.counters["forced_tokens"] == 0
    a, b = on[0][0], off[0][0]
    assert a.token_ids == b.token_ids
    assert [lp.token_id for lp in a.logprobs] == a.token_ids
    # Same distribution; a draft row and a decode row may differ in the last float bits.
    assert [lp.logprob for lp in a.logprobs] == pytest.approx(
        [lp.logprob for lp in b.logprobs], abs=1e-4
    )


def test_prefill_pass_verifies_the_opening_draft_and_adds_the_bonus(smollm2, tokinfo):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), tokinfo)
    prompt = chat(smollm2, "Describe a person as a JSON object.")
    params = SamplingParams(max_tokens=24, temperature=0)
    eng = make_engine(smollm2)
    rid = eng.add_request(prompt, params, compiled)
    (seq,) = eng.live_sequences()
    draft = list(seq.draft)
    assert len(draft) >= 2  # '{"name":' is forced before anything is computed
    first = eng.step()  # the prefill pass
    c = eng.counters
    assert c["draft_tokens"] == len(draft) and c["draft_accepted"] >= 1
    # One pass gave the accepted drafts, one sampled token after them, and forced tokens.
    assert c["seq_forward_passes"] == 1
    assert len(first[0].token_ids) == c["draft_accepted"] + 1 + c["forced_tokens"]
    rest = eng.run_until_done()[rid][0]
    ref = make_engine(smollm2, jump_forward=False).generate([prompt], params, [compiled])[0][0]
    assert list(first[0].token_ids) + rest.token_ids == ref.token_ids
    eng.check_integrity()


def test_preempted_constrained_sequences_resume_exactly(smollm2, phone, tokinfo):
    choice = compile_constraint(ConstraintSpec.choice(["yes, certainly", "no, never"]), tokinfo)
    prompts = [chat(smollm2, q) for q in ("Your number?", "Is the sky blue?", "Call me.")]
    params = SamplingParams(max_tokens=16, temperature=0)
    constraints = [phone, choice, phone]
    ref = make_engine(smollm2, jump_forward=False).generate(prompts, params, constraints)
    per_slot = KVPool.slot_bytes(30, 3, 64, torch.float32)
    need = max(len(p) for p in prompts) + params.max_tokens
    eng = make_engine(smollm2, kv_cache_bytes=per_slot * (need + 16), max_num_seqs=3)
    got = eng.generate(prompts, params, constraints)
    assert eng.scheduler.num_preemptions > 0
    assert [c[0].token_ids for c in got] == [c[0].token_ids for c in ref]
    eng.check_integrity()


@pytest.mark.parametrize(
    "before, forced",
    [
        ('{"name":"Bob', '","age":'),
        ('{"name":"Bob"', ',"age":'),
        ("The answer is", " forty-two."),
        ('{"items":[1,', '"x"]}'),
    ],
)
def test_draft_keeps_the_output_and_follows_canonical_tokenization(smollm2, before, forced):
    tok = smollm2.tokenizer
    output = tok.encode(before, add_special_tokens=False)
    draft = _tokenize_after(output, tok, forced)
    joint = tok.encode(before + forced, add_special_tokens=False)
    assert tok.decode(draft) == forced
    if joint[: len(output)] == output:  # the forced text does not re-tokenize the output
        assert output + draft == joint
    else:
        assert draft == tok.encode(forced, add_special_tokens=False)


def test_draft_hints_learn_where_the_model_splits_the_last_token(smollm2):
    tok = smollm2.tokenizer
    whole = tok.convert_tokens_to_ids('":"')
    head = tok.convert_tokens_to_ids('":')
    quote = tok.convert_tokens_to_ids('"')
    key = tok.encode("name", add_special_tokens=False)
    hints = DraftHints(tok)
    draft, boundary = hints.shape(key + [whole])
    assert draft == key + [whole]
    hints.observe(boundary, draft, key + [head])  # the model took '":' instead
    draft, boundary = hints.shape(key + [whole])
    assert draft == key + [head, quote]
    for _ in range(3):  # the model now takes the whole token at the boundary: unlearn
        hints.observe(boundary, draft, key + [whole])
    assert hints.shape(key + [whole])[0] == key + [whole]


@pytest.mark.parametrize("min_n,max_n", [(3, 3), (2, 4), (1, 5)])
def test_lookup_draft_follows_the_longest_latest_earlier_occurrence(smollm2, min_n, max_n):
    from corral.engine.constrained.lookup import LookupIndex
    from corral.engine.serving.core import Sequence

    tok = smollm2.tokenizer
    text = '[{"a":1,"b":2},{"a":1,"b":3},{"a":1,"b":'
    ids = tok.encode(text, add_special_tokens=False)
    seq = Sequence("r", 0, ids[:5], SamplingParams(), seed=0)
    index = LookupIndex(min_n, max_n)

    def brute(all_ids: list[int], limit: int) -> list[int]:
        for n in range(max_n, min_n - 1, -1):  # the longest suffix n-gram that occurred first
            tail = all_ids[-n:]
            for end in range(len(all_ids) - 1, n - 1, -1):
                if len(all_ids) >= n and all_ids[end - n : end] == tail:
                    return all_ids[end : end + limit]
        return []

    hits = 0
    for t in ids[5:]:  # the output grows one token at a time, the index follows
        seq.output_ids.append(t)
        got = index.propose(seq, [], 4)
        assert got == brute(seq.all_ids(), 4)
        hits += bool(got)
    assert hits > 3  # the repeated objects were found


def test_logprob_entries_name_the_tokens_the_grammar_forced(smollm2, phone):
    """Entries say how many tokens each row allowed; a row that allowed one token is "forced"
    (certain: logprob 0, its own only alternative); with jump-forward on, drafted tokens the draw
    confirmed are "forced" too, so its forced positions include those of token-by-token decoding."""
    prompts = [chat(smollm2, "What is the phone number of the town hall?")]
    params = SamplingParams(max_tokens=20, temperature=0, logprobs=True, top_logprobs=2)
    (on, off), _, _ = both(smollm2, prompts, params, [phone])
    forced = {}
    for name, choice in (("on", on[0][0]), ("off", off[0][0])):
        for lp in choice.logprobs:
            assert lp.allowed >= 1
            if lp.allowed == 1:
                assert lp.source == "forced" and lp.logprob == pytest.approx(0, abs=1e-5)
                assert [t for t, _ in lp.top] == [lp.token_id]
        forced[name] = {i for i, lp in enumerate(choice.logprobs) if lp.source == "forced"}
        text = smollm2.tokenizer.decode([choice.token_ids[i] for i in sorted(forced[name])])
        assert set("() -") <= set(text)  # the phone number's punctuation is the grammar's
        assert any(lp.source == "sampled" and 1 < lp.allowed < 1000 for lp in choice.logprobs)
    assert forced["off"] <= forced["on"]
