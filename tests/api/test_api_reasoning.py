"""Reasoning models: the think block is split from the answer however the text is cut, and a
constraint after the block (a schema, tool calls) holds: random walks through the compiled
masks of SmolLM2's real tokenizer stand in for the model, `jsonschema` judges the answers.
`max_reasoning_tokens` runs end to end: a real `corral serve --reasoning-format deepseek-r1`
with the default model (which never writes `</think>` itself), the real `openai` client."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from test_api_tools import WEATHER, _Out, random_walk, request

from corral.api.choices import ChoiceState
from corral.api.reasoning import REASONING_FORMATS
from corral.api.tool_formats import FORMATS
from corral.api.tools import plan_tools
from corral.grammar import ConstraintSpec, compile_constraint

R1, QWEN3 = REASONING_FORMATS["deepseek-r1"], REASONING_FORMATS["qwen3"]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer"],
    "additionalProperties": False,
}


def split(fmt, text: str, pieces: list[str] | None = None, plan=None):
    state = ChoiceState(0, plan or plan_tools(request()), fmt)
    parts = pieces or [text]
    updates = [state.add(_Out(p, "stop" if k == len(parts) - 1 else None)) for k, p in enumerate(parts)]  # fmt: skip
    return state.result(), updates


def test_the_block_is_split_however_the_text_is_cut() -> None:
    text = "<think>\nSix times seven is 42.\n</think>\n\nThe answer is 42."
    whole, _ = split(QWEN3, text)
    assert whole.reasoning == "\nSix times seven is 42.\n" and whole.content == "The answer is 42."
    rng = random.Random(1)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), 10))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        cut, updates = split(QWEN3, text, pieces)
        assert (cut.reasoning, cut.content) == (whole.reasoning, whole.content)
        assert "".join(u.reasoning for u in updates) == whole.reasoning
        assert "".join(u.content for u in updates) == whole.content


def test_formats_differ_only_where_the_block_is_not_closed() -> None:
    assert split(R1, "still thinking")[0].reasoning == "still thinking"  # the template opened it
    assert split(QWEN3, "no think block")[0].content == "no think block"
    assert split(R1, "hm</think>42")[0].content == "42"  # opened by the template, closed here
    assert split(QWEN3, "<think>hm</think>42")[0].reasoning == "hm"


def test_a_constrained_answer_after_the_block_validates(smol_tokenizer, smol_tok_info) -> None:
    spec = ConstraintSpec.json_schema(ANSWER).after_reasoning(QWEN3.open, QWEN3.close)
    compiled = compile_constraint(spec, smol_tok_info)
    rng = random.Random(4)
    for _ in range(4):
        prefix = smol_tokenizer.encode("<think>Let me think: {not json} ...</think>")
        text = smol_tokenizer.decode(random_walk(compiled, smol_tok_info, rng, prefix))
        result, _ = split(QWEN3, text)
        assert result.reasoning == "Let me think: {not json} ..."
        jsonschema.validate(json.loads(result.content), ANSWER)


def test_tool_calls_after_the_block(smol_tokenizer, smol_tok_info) -> None:
    fmt = FORMATS["hermes"]
    plan = plan_tools(request(tools=[WEATHER], tool_choice="required"), fmt=fmt)
    compiled = compile_constraint(plan.spec.after_reasoning(R1.open, R1.close), smol_tok_info)
    prefix = smol_tokenizer.encode("The user wants Oslo.</think>\n")
    text = smol_tokenizer.decode(random_walk(compiled, smol_tok_info, random.Random(2), prefix))
    result, _ = split(R1, text, plan=plan)
    assert result.reasoning == "The user wants Oslo." and result.finish_reason == "tool_calls"
    assert result.tool_calls and result.content is None
    for call in result.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


ASK = [{"role": "user", "content": "Think about six times seven, then answer as JSON."}]
STRICT = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": ANSWER}}


def _budgeted(srv, stream: bool, budget: int = 16):
    kw = dict(model=srv.model, messages=ASK, temperature=0, max_tokens=60, response_format=STRICT)
    client = srv.client()
    extra = {"max_reasoning_tokens": budget}
    if not stream:
        r = client.chat.completions.create(**kw, extra_body=extra)
        m = r.choices[0].message
        return m.model_extra.get("reasoning_content"), m.content, r.choices[0].finish_reason
    reasoning, content, finish = None, "", None
    for chunk in client.chat.completions.create(**kw, extra_body=extra, stream=True):
        for c in chunk.choices:
            piece = (c.delta.model_extra or {}).get("reasoning_content")
            reasoning = (reasoning or "") + piece if piece else reasoning
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    return reasoning, content, finish


def test_the_budget_closes_the_block_and_the_schema_holds(r1_server) -> None:
    whole = _budgeted(r1_server, stream=False)
    reasoning, content, finish = whole
    assert reasoning and finish == "stop"
    jsonschema.validate(json.loads(content), ANSWER)
    assert _budgeted(r1_server, stream=True) == whole
    # the block is exactly the model's first 16 tokens: what it writes unconstrained in 16
    plain = r1_server.client().chat.completions.create(
        model=r1_server.model, messages=ASK, temperature=0, max_tokens=16
    )
    assert plain.choices[0].finish_reason == "length"
    assert plain.choices[0].message.model_extra["reasoning_content"] == reasoning
    # with no constraint too: 8 tokens of thinking (a prefix of those 16), then the answer
    short = r1_server.client().chat.completions.create(
        model=r1_server.model, messages=ASK, temperature=0, max_tokens=20,
        extra_body={"max_reasoning_tokens": 8},
    )  # fmt: skip
    m = short.choices[0].message
    assert reasoning.startswith(m.model_extra["reasoning_content"]) and m.content
    assert len(m.model_extra["reasoning_content"]) < len(reasoning)


def test_a_budget_of_zero_leaves_no_reasoning(r1_server) -> None:
    reasoning, content, finish = _budgeted(r1_server, stream=False, budget=0)
    assert not reasoning and finish == "stop"
    jsonschema.validate(json.loads(content), ANSWER)


@pytest.mark.parametrize("bad", [-1, 1.5, "16", True])
def test_a_bad_budget_is_a_400(r1_server, bad) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        r1_server.client().chat.completions.create(
            model=r1_server.model, messages=ASK, extra_body={"max_reasoning_tokens": bad}
        )
    assert info.value.param == "max_reasoning_tokens"


def test_a_budget_without_a_reasoning_format_is_a_400(server) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(
            model=server.model, messages=ASK, extra_body={"max_reasoning_tokens": 16}
        )
    assert info.value.param == "max_reasoning_tokens"
    assert "--reasoning-format" in info.value.message
