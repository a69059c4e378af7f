"""Tool calling without the model: the plan's constraint, its errors, parsing, the prompt.

The constraint is compiled for SmolLM2's real tokenizer, and random walks through its token masks
stand in for a model that picks arbitrary allowed tokens: whatever they produce must parse into
tool calls whose arguments `jsonschema` accepts.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from corral.api.errors import ApiError
from corral.api.prompting import ChatFormatter
from corral.api.protocol import ChatCompletionRequest
from corral.api.tools import TOOL_CALL_TAG, parse_output, plan_tools, tool_unenforced
from corral.grammar import compile_constraint

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {
                "tz": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "dst": {"type": "boolean"},
            },
            "required": ["tz", "dst"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}


def request(**kw) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "What is the weather in Oslo?"}]}
    return ChatCompletionRequest.model_validate(body | kw)


def random_walk(compiled, tok_info, rng: random.Random, max_steps: int = 400) -> list[int]:
    """Token ids picked uniformly among those the mask allows, EOS as soon as it is allowed."""
    m = compiled.matcher()
    mask = torch.zeros((1, tok_info.mask_words), dtype=torch.int32)
    ids: list[int] = []
    for _ in range(max_steps):
        if m.can_terminate() and rng.random() < 0.5:
            return ids
        m.fill_mask(mask, 0)
        words = mask[0].numpy().view("uint32")
        allowed = [
            32 * j + b
            for j in range(len(words))
            if words[j]
            for b in range(32)
            if words[j] >> b & 1
        ]
        allowed = [t for t in allowed if t not in tok_info.eos_token_ids]
        if not allowed:
            return ids
        tok = rng.choice(allowed)
        assert m.accept(tok)
        ids.append(tok)
    pytest.fail("random walk did not terminate")


@pytest.mark.parametrize(
    ("choice", "parallel", "names"),
    [("required", True, {"get_weather", "get_time"}),
     ({"type": "function", "function": {"name": "get_time"}}, True, {"get_time"}),
     ("required", False, {"get_weather", "get_time"})],
)  # fmt: skip
def test_random_outputs_are_valid_calls(
    choice, parallel, names, smol_tokenizer, smol_tok_info
) -> None:
    plan = plan_tools(
        request(tools=[WEATHER, CLOCK], tool_choice=choice, parallel_tool_calls=parallel)
    )
    assert plan.mode == "required" and plan.prompt_suffix == TOOL_CALL_TAG
    compiled = compile_constraint(plan.spec, smol_tok_info)
    rng = random.Random(7)
    for _ in range(12):
        text = smol_tokenizer.decode(random_walk(compiled, smol_tok_info, rng))
        parsed = parse_output(text, plan)
        assert parsed.content is None and parsed.tool_calls, text
        if not parallel or isinstance(choice, dict):
            assert len(parsed.tool_calls) == 1
        for call in parsed.tool_calls:
            assert call.function.name in names and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_auto_allows_text_or_calls_but_not_a_broken_call(smol_tokenizer, smol_tok_info) -> None:
    plan = plan_tools(request(tools=[WEATHER, CLOCK]))
    assert plan.mode == "auto" and plan.prompt_suffix == ""
    compiled = compile_constraint(plan.spec, smol_tok_info)

    def accepts(text: str) -> bool:
        m = compiled.matcher()
        return all(m.accept(t) for t in smol_tokenizer.encode(text)) and m.can_terminate()

    call = TOOL_CALL_TAG + json.dumps(
        [{"name": "get_time", "parameters": {"tz": "UTC", "dst": False}}]
    )
    assert accepts("It is sunny in Oslo.")
    assert accepts(call)
    assert not accepts(
        TOOL_CALL_TAG + '[{"name": "get_time", "parameters": {"tz": "utc", "dst": false}}]'
    )
    assert not accepts(TOOL_CALL_TAG + "I will call a tool")
    assert parse_output(call, plan).tool_calls[0].function.name == "get_time"
    assert parse_output("Hello", plan).content == "Hello"


def test_strict_unenforceable_keyword_is_a_400_naming_the_function() -> None:
    tagged = json.loads(json.dumps(CLOCK))
    tagged["function"]["parameters"]["properties"]["tags"] = {"type": "array", "uniqueItems": True}
    with pytest.raises(ApiError) as info:
        plan_tools(request(tools=[WEATHER, tagged], tool_choice="auto"))
    err = info.value
    assert err.status == 400 and err.param == "tools[1].function.parameters"
    assert err.extra == {"pointer": "/properties/tags/uniqueItems", "keyword": "uniqueItems"}


def test_lenient_function_reports_what_it_did_not_enforce(smol_tok_info) -> None:
    tagged = json.loads(json.dumps(CLOCK))
    tagged["function"]["parameters"]["properties"]["tags"] = {"type": "array", "uniqueItems": True}
    tagged["function"]["strict"] = False
    req = request(tools=[tagged], tool_choice="required")
    plan = plan_tools(req)
    compiled = compile_constraint(plan.spec, smol_tok_info)
    found = [(u.pointer, u.keyword, u.reason) for u in compiled.unenforced]
    report = tool_unenforced(found, plan.tools, req.tools)
    assert [(u.param, u.pointer, u.keyword) for u in report] == [
        ("tools[0].function.parameters", "/properties/tags/uniqueItems", "uniqueItems")
    ]


def test_prompt_describes_tools_and_replays_tool_history(smol_tokenizer) -> None:
    fmt = ChatFormatter(smol_tokenizer, smol_tokenizer.chat_template)
    assert not fmt.native_tools  # SmolLM2's template ignores `tools`
    args = json.dumps({"city": "Oslo", "unit": "c"})
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees"},
    ]  # fmt: skip
    req = request(messages=history, tools=[WEATHER], tool_choice="required")
    text = fmt.prompt_text(req, plan_tools(req))
    assert text.startswith("<|im_start|>system\nYou can call these functions")
    assert '"name": "get_weather"' in text and "Current weather in a city" in text
    assert (
        TOOL_CALL_TAG + '[{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}]'
        in text
    )
    assert "<|im_start|>tool\n12 degrees<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n" + TOOL_CALL_TAG)


def test_tool_choice_none_keeps_tools_out_of_the_prompt(smol_tokenizer) -> None:
    fmt = ChatFormatter(smol_tokenizer, smol_tokenizer.chat_template)
    req = request(tools=[WEATHER], tool_choice="none")
    plan = plan_tools(req)
    assert plan.spec is None
    assert "get_weather" not in fmt.prompt_text(req, plan)


def test_invalid_arguments_in_history_are_a_400(smol_tokenizer) -> None:
    fmt = ChatFormatter(smol_tokenizer, smol_tokenizer.chat_template)
    bad = [{"role": "user", "content": "hi"},
           {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]  # fmt: skip
    req = request(messages=bad, tools=[WEATHER])
    with pytest.raises(ApiError) as info:
        fmt.prompt_text(req, plan_tools(req))
    assert info.value.status == 400


def test_parameters_are_closed_unless_the_request_opens_them() -> None:
    from corral.api.response_formats import wants_closed_objects

    loose = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"q": {}}}},
    }
    req = request(tools=[loose], tool_choice="required")
    closed = json.loads(plan_tools(req, closed=True).spec.source)
    opened = json.loads(plan_tools(req, closed=False).spec.source)
    assert closed["items"]["properties"]["parameters"]["additionalProperties"] is False
    assert "additionalProperties" not in opened["items"]["properties"]["parameters"]
    assert wants_closed_objects(None, server_default_open=False)
    assert not wants_closed_objects(None, server_default_open=True)
    assert not wants_closed_objects(True, server_default_open=False)
    assert wants_closed_objects(False, server_default_open=True)
