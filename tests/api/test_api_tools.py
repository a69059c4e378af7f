"""Tool calling without the model: each format's constraint, its errors, reading calls back, the
prompt, and the real chat templates of each format (tests/api/data/chat_templates).

Constraints are compiled for real tokenizers (SmolLM2's; Llama-3's for the Llama 3 format, whose
``<|python_tag|>`` is a special token there), and random walks through their token masks stand
in for a model that picks arbitrary allowed tokens: whatever they produce must read back into
tool calls whose arguments `jsonschema` accepts.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
import torch

from corral.api.choices import ChoiceState
from corral.api.errors import ApiError
from corral.api.prompting import ChatFormatter
from corral.api.protocol import ChatCompletionRequest
from corral.api.tool_formats import FORMATS, GENERIC, choose_format
from corral.api.tools import plan_tools, tool_constraint_error, tool_unenforced
from corral.grammar import ConstraintError, compile_constraint

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
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


class _Out:
    """An engine output as ``ChoiceState`` reads it (text, one token, a finish reason)."""

    def __init__(self, text: str, finish: str | None = None) -> None:
        self.text, self.token_ids, self.logprobs, self.finish_reason = text, (0,), None, finish


def read_back(plan, text: str, finish: str = "stop", pieces: list[str] | None = None):
    """The choice result of ``text`` fed in ``pieces`` (whole when None), and every update."""
    state = ChoiceState(0, plan)
    parts = pieces if pieces is not None else [text]
    updates = [state.add(_Out(p, finish if k == len(parts) - 1 else None)) for k, p in enumerate(parts)]  # fmt: skip
    return state.result(), updates


def random_walk(compiled, tok_info, rng: random.Random, prefix=(), max_steps: int = 600):
    """``prefix`` token ids, then ids picked uniformly among those the mask allows (EOS as soon
    as it is allowed, half of the time)."""
    m = compiled.matcher()
    ids = list(prefix)
    assert all(m.accept(t) for t in ids)
    mask = torch.zeros((1, tok_info.mask_words), dtype=torch.int32)
    for _ in range(max_steps):
        if m.can_terminate() and rng.random() < 0.5:
            return ids
        m.fill_mask(mask, 0)
        words = mask[0].numpy().view("uint32")
        allowed = [32 * j + b for j in range(len(words)) if words[j] for b in range(32)
                   if words[j] >> b & 1 and 32 * j + b not in tok_info.eos_token_ids]  # fmt: skip
        if not allowed:
            return ids
        tok = rng.choice(allowed)
        assert m.accept(tok)
        ids.append(tok)
    pytest.fail("random walk did not terminate")


def _check_calls(result, names) -> None:
    for call in result.tool_calls:
        assert call.function.name in names and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize(
    ("choice", "parallel", "names"),
    [("required", True, {"get_weather", "get_time"}),
     ({"type": "function", "function": {"name": "get_time"}}, True, {"get_time"}),
     ("required", False, {"get_weather", "get_time"})],
)  # fmt: skip
def test_random_required_outputs_are_valid_calls(
    fmt, choice, parallel, names, smol_tokenizer, smol_tok_info
) -> None:
    req = request(tools=[WEATHER, CLOCK], tool_choice=choice, parallel_tool_calls=parallel)
    plan = plan_tools(req, fmt=FORMATS[fmt])
    assert plan.mode == "required"
    compiled = compile_constraint(plan.spec, smol_tok_info)
    rng = random.Random(7)
    for _ in range(5):
        text = smol_tokenizer.decode(random_walk(compiled, smol_tok_info, rng))
        result, _ = read_back(plan, text)
        assert result.content is None and result.tool_calls, text
        assert result.finish_reason == "tool_calls"
        if not parallel or isinstance(choice, dict):
            assert len(result.tool_calls) == 1
        _check_calls(result, names)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_auto_interleaves_text_and_valid_calls(fmt, smol_tokenizer, smol_tok_info) -> None:
    """Free text, a call the model starts (its trigger), free text again, another call."""
    plan = plan_tools(request(tools=[WEATHER, CLOCK]), fmt=FORMATS[fmt])
    assert plan.mode == "auto"
    compiled = compile_constraint(plan.spec, smol_tok_info)
    trigger = FORMATS[fmt].triggers[0]
    rng = random.Random(11)
    calls = 0
    for _ in range(4):
        prefix = smol_tokenizer.encode("Let me check. " + trigger)
        ids = random_walk(compiled, smol_tok_info, rng, prefix)
        text = smol_tokenizer.decode(ids)
        result, _ = read_back(plan, text)
        assert result.content.startswith("Let me check. "), text
        assert result.tool_calls, text
        _check_calls(result, {"get_weather", "get_time"})
        calls += len(result.tool_calls)
    assert calls >= 4

    def accepts(text: str) -> bool:
        m = compiled.matcher()
        return all(m.accept(t) for t in smol_tokenizer.encode(text)) and m.can_terminate()

    f = FORMATS[fmt]
    one = f.render_call("get_time", {"tz": "UTC", "dst": False})
    two = f.render_call("get_weather", {"city": "Oslo", "unit": "c"})
    assert accepts("It is sunny in Oslo.")
    assert accepts(f"First, {one} and then {two} done.")
    assert not accepts("Hi " + f.render_call("get_time", {"tz": "utc", "dst": False}))
    assert not accepts(f"Hi {trigger} I will not call")
    result, _ = read_back(plan, f"First, {one} and then {two} done.")
    assert result.content == "First,  and then  done."
    assert [c.function.name for c in result.tool_calls] == ["get_time", "get_weather"]


def test_no_parallel_calls_ends_the_output_after_one(smol_tokenizer, smol_tok_info) -> None:
    plan = plan_tools(request(tools=[WEATHER, CLOCK], parallel_tool_calls=False), fmt=GENERIC)
    compiled = compile_constraint(plan.spec, smol_tok_info)
    one = GENERIC.render_call("get_time", {"tz": "UTC", "dst": False})
    m = compiled.matcher()
    assert all(m.accept(t) for t in smol_tokenizer.encode("Ok. " + one))
    assert m.is_terminated()


def test_llama3_format_on_llama3s_tokenizer(llama3_tokenizer) -> None:
    """Both Llama 3 openers, on Llama-3's own tokenizer (its 3.0 vocabulary has no
    ``<|python_tag|>`` token, so there the tag is text; ``tests/grammar`` covers special-token
    triggers)."""
    fmt = FORMATS["llama3"]
    plan = plan_tools(request(tools=[WEATHER, CLOCK]), fmt=fmt)
    compiled = compile_constraint(plan.spec, llama3_tokenizer)
    hf = llama3_tokenizer.hf_tokenizer
    rng = random.Random(5)
    for trigger in fmt.triggers:
        ids = random_walk(compiled, llama3_tokenizer, rng, hf.encode("Sure. " + trigger))
        result, _ = read_back(plan, hf.decode(ids))
        assert result.tool_calls and result.content.startswith("Sure. ")
        _check_calls(result, {"get_weather", "get_time"})


def test_pieces_do_not_change_what_is_read(smol_tokenizer, smol_tok_info) -> None:
    """Streaming: the call's name once its opener is complete, then argument deltas; any cut of
    the text into pieces reads back the same calls and content."""
    for name, fmt in FORMATS.items():
        plan = plan_tools(request(tools=[WEATHER, CLOCK]), fmt=fmt)
        text = (
            "Checking. "
            + fmt.render_call("get_weather", {"city": "Lima", "unit": "f", "days": 3})
            + " and "
            + fmt.render_call("get_time", {"tz": "CET", "dst": True})
        )
        whole, _ = read_back(plan, text)
        rng = random.Random(name)
        for _ in range(20):
            cuts = sorted(rng.sample(range(1, len(text)), 12))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            cut, updates = read_back(plan, text, pieces=pieces)
            assert cut.content == whole.content == "Checking.  and "
            assert [c.function for c in cut.tool_calls] == [c.function for c in whole.tool_calls]
            starts = [p for u in updates for p in u.calls if p.name is not None]
            assert [p.name for p in starts] == ["get_weather", "get_time"]
        small = [text[i : i + 5] for i in range(0, len(text), 5)]  # five characters a token
        cut, updates = read_back(plan, text, pieces=small)
        args = [p.arguments for u in updates for p in u.calls if p.index == 0 and p.arguments]
        assert len(args) > 1 and "".join(args) == whole.tool_calls[0].function.arguments


def test_a_call_cut_by_max_tokens_says_length(smol_tok_info) -> None:
    plan = plan_tools(request(tools=[WEATHER], tool_choice="required"), fmt=GENERIC)
    cut = GENERIC.render_call("get_weather", {"city": "Oslo", "unit": "c"})[:-8]
    result, _ = read_back(plan, cut, finish="length")
    assert result.finish_reason == "length"
    assert result.tool_calls[0].function.arguments == '{"city": "Oslo", "unit"'


def test_strict_unenforceable_keyword_is_a_400_naming_the_function(smol_tok_info) -> None:
    tagged = json.loads(json.dumps(CLOCK))
    tagged["function"]["parameters"]["properties"]["tags"] = {"type": "array", "uniqueItems": True}
    req = request(tools=[WEATHER, tagged], tool_choice="auto")
    plan = plan_tools(req)
    with pytest.raises(ConstraintError) as info:
        compile_constraint(plan.spec, smol_tok_info)
    err = tool_constraint_error(info.value, plan, req.tools)
    assert isinstance(err, ApiError)
    assert err.status == 400 and err.param == "tools[1].function.parameters"
    assert err.extra == {"pointer": "/properties/tags/uniqueItems", "keyword": "uniqueItems"}


def test_lenient_function_reports_what_it_did_not_enforce(smol_tok_info) -> None:
    tagged = json.loads(json.dumps(CLOCK))
    tagged["function"]["parameters"]["properties"]["tags"] = {"type": "array", "uniqueItems": True}
    tagged["function"]["strict"] = False
    req = request(tools=[tagged], tool_choice="required")
    plan = plan_tools(req, fmt=FORMATS["llama3"])  # two openers: reported once
    compiled = compile_constraint(plan.spec, smol_tok_info)
    found = [(u.pointer, u.keyword, u.reason) for u in compiled.unenforced]
    report = tool_unenforced(found, plan, req.tools)
    assert [(u.param, u.pointer, u.keyword) for u in report] == [
        ("tools[0].function.parameters", "/properties/tags/uniqueItems", "uniqueItems")
    ]


def test_prompt_describes_tools_and_replays_tool_history(smol_tokenizer) -> None:
    fmt = ChatFormatter(smol_tokenizer, smol_tokenizer.chat_template)
    assert not fmt.native_tools  # SmolLM2's template ignores `tools`
    assert fmt.tool_format is GENERIC
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
        '<tool_call>[{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}]' in text
    )
    assert "<|im_start|>tool\n12 degrees<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("template", "expected", "history_call"),
    [("hermes", "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'),
     ("llama3", "llama3", '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}'),
     ("mistral", "mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}')],
)  # fmt: skip
def test_real_templates_choose_their_format(
    template, expected, history_call, smol_tokenizer
) -> None:
    """Each format's chat template renders the tools natively, is detected, and writes history
    calls the way the format's constraint makes the model write them."""
    source = (TEMPLATES / f"{template}.jinja").read_text()
    formatter = ChatFormatter(smol_tokenizer, source)
    assert formatter.native_tools and formatter.tool_format is FORMATS[expected]
    fmt = formatter.tool_format
    args = {"city": "Oslo", "unit": "c"}
    assert history_call.startswith(fmt.begins("get_weather")[-1] + json.dumps(args))
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees"},
        {"role": "user", "content": "And in Lima?"},
    ]  # fmt: skip
    req = request(messages=history, tools=[WEATHER, CLOCK])
    text = formatter.prompt_text(req, plan_tools(req, fmt=fmt))
    assert history_call in text
    assert '"name": "get_time"' in text and "12 degrees" in text
    assert "You can call these functions" not in text  # the template's own tool prompt
    assert choose_format(source, True, "corral") is GENERIC  # --tool-call-format wins


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
    closed = plan_tools(req, closed=True).spec.structural_tag().structures[0].schema
    opened = plan_tools(req, closed=False).spec.structural_tag().structures[0].schema
    assert closed["additionalProperties"] is False
    assert "additionalProperties" not in opened
    assert wants_closed_objects(None, server_default_open=False)
    assert not wants_closed_objects(None, server_default_open=True)
    assert not wants_closed_objects(True, server_default_open=False)
    assert wants_closed_objects(False, server_default_open=True)
