"""The formats of Qwen3, SmolLM3, Gemma 3 and Phi-4-mini, detected from their chat templates.

The templates (tests/api/data/chat_templates) are written from each format's public description.
Checked: where each template takes the tools, which tool-call format and think block it implies,
the prompt it renders (tools, the history's calls and results, thinking switched on and off),
calls read back under each format's constraint (whole and cut into pieces, after a think block
or with thinking off), hostile inputs, and a real `corral serve --chat-template` with Qwen3's
template answering through the `openai` client. (Each format's structural tag and stream reader
are also random-walked for every format in test_api_tools.py, which iterates ``FORMATS``.)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import openai
import pytest
from api_server import start_server, stop_server
from openai.lib.streaming.chat import ChatCompletionStreamState
from test_api_tools import CLOCK, SCHEMAS, WEATHER, _Out, random_walk, request

from corral.api.choices import ChoiceState
from corral.api.errors import ApiError
from corral.api.prompting import ChatFormatter
from corral.api.reasoning import REASONING_FORMATS
from corral.api.tool_formats import FORMATS
from corral.api.tools import plan_tools
from corral.grammar import compile_constraint

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
QWEN3 = REASONING_FORMATS["qwen3"]
ARGS = {"city": "Oslo", "unit": "c"}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees"},
    {"role": "user", "content": "And in Lima?"},
]  # fmt: skip


def formatter(tokenizer, name: str, reasoning: str = "auto") -> ChatFormatter:
    return ChatFormatter(tokenizer, (TEMPLATES / f"{name}.jinja").read_text(), "auto", reasoning)


@pytest.mark.parametrize(
    ("template", "fmt", "slot", "native_calls", "reasoning"),
    [("qwen3", "hermes", "tools", True, "qwen3"),
     ("smollm3", "hermes", "xml_tools", False, "qwen3"),
     ("gemma3", "gemma", None, False, None),
     ("phi4_mini", "phi4", "system", False, None),
     ("hermes", "hermes", "tools", True, None)],
)  # fmt: skip
def test_each_template_implies_its_formats(
    template, fmt, slot, native_calls, reasoning, smol_tokenizer
) -> None:
    f = formatter(smol_tokenizer, template)
    assert f.tool_format is FORMATS[fmt]
    assert (f.tool_slot, f.native_calls) == (slot, native_calls)
    assert (f.reasoning.name if f.reasoning else None) == reasoning
    # the flags win over detection
    assert formatter(smol_tokenizer, template, "none").reasoning is None
    assert formatter(smol_tokenizer, template, "deepseek-r1").reasoning.name == "deepseek-r1"


def test_smollm2s_own_template_keeps_the_generic_format(smol_tokenizer) -> None:
    f = ChatFormatter(smol_tokenizer, smol_tokenizer.chat_template, "auto", "auto")
    assert (f.tool_format.name, f.tool_slot, f.reasoning) == ("corral", None, None)


def test_a_template_that_opens_the_block_is_deepseek_r1(smol_tokenizer) -> None:
    opens = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}"
    )
    f = ChatFormatter(smol_tokenizer, opens, "auto", "auto")
    assert f.reasoning is REASONING_FORMATS["deepseek-r1"]


@pytest.mark.parametrize(
    ("template", "expected"),
    [("qwen3", ['{"type": "function", "function": {"name": "get_time"',
                "<|im_start|>user\n<tool_response>\n12 degrees\n</tool_response><|im_end|>"]),
     ("smollm3", ["<tools>\n{'name': 'get_weather', 'description'", "'name': 'get_time'",
                  "<|im_start|>user\n12 degrees<|im_end|>", "Reasoning Mode: /think",
                  "## Custom Instructions\n\nBe brief."]),
     ("gemma3", ["<start_of_turn>user\nBe brief.\n\nYou can call these functions", '"name": "get_time"',
                 "<start_of_turn>user\n```tool_output\n12 degrees\n```\nAnd in Lima?<end_of_turn>"]),
     ("phi4_mini", ['<|system|>Be brief.<|tool|>[{"name": "get_weather", "description": "Current weather in a city"',
                    '"name": "get_time"', "<|/tool|><|end|><|user|>Weather in Oslo?<|end|>"])],
)  # fmt: skip
def test_the_prompt_carries_the_tools_and_the_history(template, expected, smol_tokenizer) -> None:
    """Tools where the template reads them, the history's call as the format writes it (by the
    template, or in the assistant's content where the template does not render calls), the
    tool result as the template (or the format, for Gemma) shows it."""
    f = formatter(smol_tokenizer, template)
    req = request(messages=HISTORY, tools=[WEATHER, CLOCK])
    text = f.prompt_text(req, plan_tools(req, fmt=f.tool_format))
    assert f.tool_format.render_call("get_weather", ARGS) in text
    for piece in expected:
        assert piece in text, piece
    assert text.count("get_weather") >= 2 and "And in Lima?" in text
    native = f.native_tools
    assert ("You can call these functions" in text) is not native


@pytest.mark.parametrize(
    ("template", "extra", "thinking", "tail"),
    [("qwen3", {}, True, "<|im_start|>assistant\n"),
     ("qwen3", {"chat_template_kwargs": {"enable_thinking": False}}, False,
      "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
     ("qwen3", {"chat_template_kwargs": {"enable_thinking": True}}, True, "<|im_start|>assistant\n"),
     ("smollm3", {}, True, "<|im_start|>assistant\n"),
     ("smollm3", {"chat_template_kwargs": {"enable_thinking": False}}, False,
      "<|im_start|>assistant\n<think>\n\n</think>\n"),
     ("smollm3", {"messages": [{"role": "system", "content": "Be brief. /no_think"},
                               {"role": "user", "content": "hi"}]}, False, "</think>\n")],
)  # fmt: skip
def test_thinking_switched_off_in_the_prompt_means_no_reasoning(
    template, extra, thinking, tail, smol_tokenizer
) -> None:
    f = formatter(smol_tokenizer, template)
    req = request(**extra)
    plan = plan_tools(req)
    ids, reasoning = f.prompt(req, plan)
    text = f.prompt_text(req, plan)
    assert text.endswith(tail) and ids
    assert reasoning is (QWEN3 if thinking else None)


def _read(plan, text: str, reasoning=None, pieces: list[str] | None = None):
    state = ChoiceState(0, plan, reasoning)
    parts = pieces if pieces is not None else [text]
    for k, p in enumerate(parts):
        state.add(_Out(p, "stop" if k == len(parts) - 1 else None))
    return state.result()


def _cuts(text: str, rng: random.Random, n: int = 10) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(n, len(text) - 1)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _check(result) -> None:
    assert result.tool_calls
    for call in result.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_qwen3_calls_after_the_think_block(choice, smol_tokenizer, smol_tok_info) -> None:
    """Hermes calls after ``<think>…</think>`` under the think-then-tools constraint; the split
    and the calls are the same however the text is cut."""
    plan = plan_tools(request(tools=[WEATHER, CLOCK], tool_choice=choice), fmt=FORMATS["hermes"])
    compiled = compile_constraint(plan.spec.after_reasoning(QWEN3.open, QWEN3.close), smol_tok_info)
    rng = random.Random(3)
    opener = "<think>\nThe user wants Oslo.\n</think>\n\n" + (
        "<tool_call>" if choice == "auto" else ""
    )
    for _ in range(3):
        ids = random_walk(compiled, smol_tok_info, rng, smol_tokenizer.encode(opener))
        text = smol_tokenizer.decode(ids)
        whole = _read(plan, text, QWEN3)
        assert whole.reasoning == "\nThe user wants Oslo.\n", text
        _check(whole)
        cut = _read(plan, text, QWEN3, _cuts(text, rng))
        assert (cut.reasoning, cut.content) == (whole.reasoning, whole.content)
        assert [c.function for c in cut.tool_calls] == [c.function for c in whole.tool_calls]


def test_with_thinking_off_the_call_comes_first(smol_tokenizer, smol_tok_info) -> None:
    """Thinking off: no think block in the constraint, so the output is the call at once."""
    plan = plan_tools(request(tools=[WEATHER], tool_choice="required"), fmt=FORMATS["hermes"])
    compiled = compile_constraint(plan.spec, smol_tok_info)
    m = compiled.matcher()
    assert not all(m.accept(t) for t in smol_tokenizer.encode("<think>\n"))
    text = smol_tokenizer.decode(random_walk(compiled, smol_tok_info, random.Random(5)))
    assert text.startswith("<tool_call>\n{")
    _check(_read(plan, text))


@pytest.mark.parametrize("fmt", ["phi4", "gemma", "hermes"])
def test_streamed_pieces_equal_the_whole(fmt, smol_tokenizer, smol_tok_info) -> None:
    f = FORMATS[fmt]
    plan = plan_tools(request(tools=[WEATHER, CLOCK], tool_choice="required"), fmt=f)
    compiled = compile_constraint(plan.spec, smol_tok_info)
    rng = random.Random(fmt)
    for _ in range(3):
        text = smol_tokenizer.decode(random_walk(compiled, smol_tok_info, rng))
        whole = _read(plan, text)
        _check(whole)
        pieces = [smol_tokenizer.decode([t]) for t in smol_tokenizer.encode(text)]
        assert "".join(pieces) == text
        by_token = _read(plan, text, pieces=pieces)
        assert [c.function for c in by_token.tool_calls] == [c.function for c in whole.tool_calls]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [("phi4", '<|tool_call|>[{"name": "launch_rocket", "arguments": {}}]<|/tool_call|>'),
     ("phi4", "<|tool_call|>[not json at all"),
     ("gemma", "```tool_code\nprint(get_weather('Oslo'))\n```"),
     ("gemma", '```tool_code\n{"name": "get_weather"'),
     ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>')],
)  # fmt: skip
def test_malformed_calls_from_an_unconstrained_model_do_not_break_the_reader(fmt, text) -> None:
    """A format forced on a model that ignores it: text that is no call of a known function
    stays content; a call to a known function is read as written (the constraint, not the
    reader, is what guarantees the arguments)."""
    plan = plan_tools(request(tools=[WEATHER, CLOCK]), fmt=FORMATS[fmt])
    rng = random.Random(1)
    whole = _read(plan, text)
    cut = _read(plan, text, pieces=_cuts(text, rng, 6))
    assert (whole.content, [c.function for c in whole.tool_calls]) == (
        cut.content, [c.function for c in cut.tool_calls])  # fmt: skip
    names = {c.function.name for c in whole.tool_calls}
    assert names <= {"get_weather", "get_time"}
    if not names:
        assert whole.content == text


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"tools": []}, "chat_template_kwargs"),
     ({"add_generation_prompt": False}, "chat_template_kwargs"),
     ({"not a name": 1}, "chat_template_kwargs"),
     ({"_private": 1}, "chat_template_kwargs"),
     ({"bos_token": "<|im_start|>system"}, "chat_template_kwargs"),
     ({"raise_exception": None}, "chat_template_kwargs")],
)  # fmt: skip
def test_chat_template_kwargs_that_corral_sets_are_refused(kwargs, param, smol_tokenizer) -> None:
    f = formatter(smol_tokenizer, "qwen3")
    req = request(chat_template_kwargs=kwargs)
    with pytest.raises(ApiError) as info:
        f.prompt_text(req, plan_tools(req))
    assert info.value.status == 400 and info.value.param == param


def test_a_template_failing_on_a_kwarg_is_a_400(smol_tokenizer) -> None:
    adds = "{{ messages[0].content }}{{ retries + 1 }}"
    f = ChatFormatter(smol_tokenizer, adds, "auto", "auto")
    req = request(chat_template_kwargs={"retries": "three"})
    with pytest.raises(ApiError) as info:
        f.prompt_text(req, plan_tools(req))
    assert info.value.status == 400 and info.value.param == "chat_template_kwargs"


# -- a real server with Qwen3's template ------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_server(model_folder, tmp_path_factory):
    """`corral serve --chat-template qwen3.jinja` on the default model: hermes calls and the
    qwen3 think block, both detected from the template."""
    args = ("--chat-template", str(TEMPLATES / "qwen3.jinja"), "--max-concurrent", "2",
            "--memory", "256MB")  # fmt: skip
    srv = start_server(model_folder, tmp_path_factory.mktemp("corral-qwen3"), args)
    yield srv
    stop_server(srv)


def _both(server, **kw):
    client = server.client()
    body = (
        dict(
            model=server.model,
            messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=100,
            temperature=0,
        )
        | kw
    )
    plain = client.chat.completions.create(**body)
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(**body, stream=True):
        state.handle_chunk(chunk)
    return plain.choices[0], state.current_completion_snapshot.choices[0]


def _summary(choice):
    m = choice.message
    calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or ()]
    return choice.finish_reason, m.content, (m.model_extra or {}).get("reasoning_content"), calls


def test_qwen3_server_thinks_then_calls(qwen3_server) -> None:
    plain, streamed = _both(qwen3_server, extra_body={"max_reasoning_tokens": 8}, logprobs=True)
    assert _summary(plain) == _summary(streamed)
    assert plain.finish_reason == "tool_calls" and plain.message.content is None
    reasoning = plain.message.model_extra.get("reasoning_content")
    assert reasoning
    _check(plain.message)
    # as written: the block (closed at the budget), then a hermes call
    written = "".join(t.token for t in plain.logprobs.content)
    block, _, after = written.partition("</think>")
    assert reasoning in block and after.lstrip().startswith('<tool_call>\n{"name": "'), written


def test_qwen3_server_with_thinking_off_calls_at_once(qwen3_server) -> None:
    off = {"chat_template_kwargs": {"enable_thinking": False}, "max_reasoning_tokens": 8}
    plain, streamed = _both(qwen3_server, extra_body=off, logprobs=True)
    assert _summary(plain) == _summary(streamed)
    assert plain.finish_reason == "tool_calls"
    assert plain.message.model_extra.get("reasoning_content") is None
    _check(plain.message)
    written = "".join(t.token for t in plain.logprobs.content)
    assert written.startswith('<tool_call>\n{"name": "'), written  # no think block at all


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
     ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
     ({"chat_template_kwargs": {f"k{i}": i for i in range(40)}}, "chat_template_kwargs"),
     ({"tool_choice": {"type": "function", "function": {"name": "launch_rocket"}}}, "tool_choice")],
)  # fmt: skip
def test_qwen3_server_refuses_bad_requests_with_a_400(qwen3_server, extra, param) -> None:
    client = qwen3_server.client()
    body = {k: v for k, v in extra.items() if k != "chat_template_kwargs"}
    extra_body = {"chat_template_kwargs": extra["chat_template_kwargs"]} if "chat_template_kwargs" in extra else None  # fmt: skip
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=qwen3_server.model,
            messages=[{"role": "user", "content": "hi"}],
            tools=[WEATHER],
            max_tokens=5,
            extra_body=extra_body,
            **body,
        )
    assert param in (info.value.body or {}).get("param", "") or param in str(info.value)


# -- Gemma 3 and Phi-4-mini through a real server ----------------------------------------------


@pytest.fixture(scope="module", params=["gemma3", "phi4_mini"])
def template_server(request, model_folder, tmp_path_factory):
    args = ("--chat-template", str(TEMPLATES / f"{request.param}.jinja"), "--max-concurrent", "2",
            "--memory", "256MB")  # fmt: skip
    srv = start_server(model_folder, tmp_path_factory.mktemp(f"corral-{request.param}"), args)
    yield request.param, srv
    stop_server(srv)


def test_gemma_and_phi_servers_take_a_tool_history_and_call(template_server) -> None:
    """A history with a call and two results (Gemma's template wants alternating turns; Phi's
    takes the tools in the system message), then a required call: streamed equals plain, the
    arguments validate, and the call was written in the format detected from the template (the
    tokens, as logprobs return them)."""
    name, srv = template_server
    history = [
        *HISTORY[:4],
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        HISTORY[4],
    ]
    plain, streamed = _both(srv, messages=history, logprobs=True)
    assert _summary(plain) == _summary(streamed)
    assert plain.finish_reason == "tool_calls" and plain.message.content is None
    written = "".join(t.token for t in plain.logprobs.content)
    opener = {"gemma3": '```tool_code\n{"name": "', "phi4_mini": '<|tool_call|>[{"name": "'}[name]
    assert written.startswith(opener), written
    assert (plain.message.model_extra or {}).get("reasoning_content") is None  # no think block
    _check(plain.message)
