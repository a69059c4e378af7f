"""The mask and `accept()` agree token for token, for every matcher Corral builds.

Generation follows the mask; forced text (jump-forward, budget closing, drafts) is verified
with `accept()`. A token the mask refuses but `accept()` takes is a false reject of the mask (a
valid instance the model could not write); one the mask allows but `accept()` refuses would
stall generation. So at every position of MaskBench's valid instances (laid out as MaskBench
tokenizes them, `json.dumps` with its default separators, and compact) the instance's next
token and a sample of the tokens the mask allows and refuses must get the same answer from
both, on llguidance, on xgrammar, and through each wrapper (value checks, distinct keys, open
items, structural tags).

Before `quirks.FORCED_BYTES_MASK_ONE_SPELLING` was worked around, llguidance's mask allowed only
`":{"` after `{"collector` (the canonical first token of forced bytes) while `accept()` took
`":` too: 10 of the first 85 Github_hard instances walked into such a position. Now `accept()`
refuses what that mask refuses (the mask keeps the spelling the model was trained on).
"""

from __future__ import annotations

import json
import random
from functools import partial

import pytest
import torch

from corral.fuzz.targets import compile_xgrammar_schema
from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.backends.xgr import XGrammarMatcher
from corral.grammar.core.spec import JsonFormat
from corral.grammar.core.walk import allowed_bits, mask_accept_disagreements

SAMPLED = 8  # tokens the mask allows, and as many it refuses, checked at each position
SUBSETS = (
    "Github_hard",
    "Github_medium",
    "Glaiveai2K",
    "Kubernetes",
    "Snowplow",
    "JsonSchemaStore",
)
PER_SUBSET = 2


def _walk(new_matcher, tok, ids: list[int], rng: random.Random) -> tuple[int, list[str]]:
    """Walk ``ids`` (as far as the grammar takes them) checking mask against accept at every
    position; the positions checked and the disagreements found, spelt."""
    m = new_matcher()
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    n, found, positions = tok.tokenizer_vocab_size, [], 0
    for i in range(len(ids) + 1):
        if m.is_terminated():
            break
        m.fill_mask(bitmask, 0)
        allowed = allowed_bits(bitmask, 0, tok.vocab_size)
        yes = allowed[:n].nonzero()[0]
        yes = [int(yes[rng.randrange(len(yes))]) for _ in range(SAMPLED)] if len(yes) else []
        no = [t for t in rng.sample(range(n), 4 * SAMPLED) if not allowed[t]][:SAMPLED]
        tokens = ids[i : i + 1] + yes + no
        for t, by_mask in mask_accept_disagreements(m, allowed, tokens):
            verdict = "allows" if by_mask else "refuses"
            found.append(f"after {tok.token_bytes[ids[i - 1]] if i else b''!r} the mask "
                         f"{verdict} {tok.token_bytes[t]!r}, accept() does not agree")  # fmt: skip
        positions += 1
        if i == len(ids) or not m.accept(ids[i]):
            break
    return positions, found


def _instances(corpus) -> list[tuple[str, dict, list]]:
    root = corpus("maskbench")
    rng, out = random.Random(7), []
    for subset in SUBSETS:
        files = sorted(root.glob(f"{subset}---*.json"))
        for path in rng.sample(files, min(PER_SUBSET, len(files))):
            data = json.loads(path.read_text())
            valid = [t["data"] for t in data.get("tests", []) if t.get("valid")]
            if valid:
                out.append((path.name, data["schema"], valid[:2]))
    return out


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_mask_and_accept_agree_on_maskbench_instances(corpus, llama3_tokenizer, backend):
    tok, rng = llama3_tokenizer, random.Random(0)
    checked, disagreements = 0, []
    for name, schema, instances in _instances(corpus):
        for fmt, dumps in (
            (JsonFormat.python_default(), {}),
            (JsonFormat(), {"separators": (",", ":")}),
        ):
            try:
                if backend == "xgrammar":
                    native = compile_xgrammar_schema(schema, fmt, tok, strict=True)
                    new_matcher = partial(XGrammarMatcher, native)
                else:
                    spec = ConstraintSpec.json_schema(schema, json_format=fmt)
                    new_matcher = compile_constraint(spec, tok).matcher
            except (ConstraintError, ValueError, RuntimeError):
                continue  # refused: nothing to walk
            for data in instances:
                ids = tok.encode(json.dumps(data, ensure_ascii=False, **dumps))
                positions, found = _walk(new_matcher, tok, ids, rng)
                checked += positions
                disagreements += [f"{name}: {f}" for f in found]
    assert checked > 500, checked
    assert not disagreements, disagreements[:10]


#: Schemas that put each wrapper around the backend's matcher.
WRAPPED = {
    "ValueChecksMatcher": (
        {"type": "object", "properties": {"x": {"type": "number", "not": {"type": "integer"}}}},
        ['{"x": 1.5}', '{"x": -0.25}'],
    ),
    "DistinctKeysMatcher": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
        ['{"a": 1, "b": 2, "é": 3}'],
    ),
    "open items": (
        {"type": "array", "items": {"type": "object"}, "uniqueItems": True},
        ['[{"a": 1}, {"a": 2}, {}]'],
    ),
}


@pytest.mark.parametrize("kind", sorted(WRAPPED))
def test_mask_and_accept_agree_through_each_wrapper(llama3_tokenizer, kind):
    tok, rng = llama3_tokenizer, random.Random(1)
    schema, texts = WRAPPED[kind]
    compiled = compile_constraint(
        ConstraintSpec.json_schema(schema, json_format=JsonFormat.python_default()), tok
    )
    name = type(compiled.matcher()).__name__
    assert name == kind or (kind == "open items" and name == "ValueChecksMatcher"), name
    for text in texts:
        positions, found = _walk(compiled.matcher, tok, tok.encode(text), rng)
        assert positions > 3 and not found, found


def test_mask_and_accept_agree_in_a_structural_tag(llama3_tokenizer):
    tok, rng = llama3_tokenizer, random.Random(2)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tag = {
        "structures": [{"begin": "<tool=get>", "schema": schema, "end": "</tool>"}],
        "triggers": ["<tool="],
    }
    compiled = compile_constraint(ConstraintSpec.structural_tag_of(tag), tok)
    text = 'Je regarde. <tool=get>{"city": "東京"}</tool> Voilà.'
    positions, found = _walk(compiled.matcher, tok, tok.encode(text), rng)
    assert positions > 10 and not found, found
