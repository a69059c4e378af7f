"""Each architecture through a real `corral serve`: a tiny random checkpoint of the architecture
(built with its `transformers` class, SmolLM2's real tokenizer, and the chat template of that
family from `data/chat_templates`), served from its folder. A `json_schema` answer validates, and
a required tool call comes back in the format the server detected from the family's template
(as the returned tokens spell it), with arguments that validate.

The weights are random, so the text is noise; what is checked is that the architecture serves and
that the constraint and the call format hold on it. Logit equality with transformers is checked
in `tests/engine/test_engine_architectures.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import torch
import transformers
from api_server import start_server, stop_server
from test_api_tools import WEATHER

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
SMALL = dict(
    vocab_size=49152,  # SmolLM2's tokenizer
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    pad_token_id=0,
    bos_token_id=1,  # SmolLM2's <|im_start|> and <|im_end|> (some classes default to Llama 3's)
    eos_token_id=2,
)
# architecture: (transformers class, config, the family's template, the call's first characters)
ARCHITECTURES = {
    "qwen3": (
        transformers.Qwen3ForCausalLM,
        lambda: transformers.Qwen3Config(**SMALL, head_dim=16),
        "qwen3",
        "<tool_call>",
    ),
    "qwen3_moe": (
        transformers.Qwen3MoeForCausalLM,
        lambda: transformers.Qwen3MoeConfig(
            **SMALL, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32
        ),
        "qwen3",
        "<tool_call>",
    ),
    "smollm3": (
        transformers.SmolLM3ForCausalLM,
        lambda: transformers.SmolLM3Config(**SMALL, no_rope_layer_interval=2),
        "smollm3",
        "<tool_call>",
    ),
    "gemma3_text": (
        transformers.Gemma3ForCausalLM,
        lambda: transformers.Gemma3TextConfig(
            **SMALL,
            head_dim=16,
            sliding_window=8,  # shorter than every prompt here
            layer_types=["sliding_attention", "full_attention"],
        ),
        "gemma3",
        "```tool_code\n",
    ),
    "phi3": (
        transformers.Phi3ForCausalLM,
        lambda: transformers.Phi3Config(**SMALL, partial_rotary_factor=0.5),
        "phi4_mini",
        "<|tool_call|>",
    ),
}
THINKING = ("qwen3", "qwen3_moe", "smollm3")
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def arch_server(request, model_folder, tmp_path_factory):
    cls, config, template, opener = ARCHITECTURES[request.param]
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    torch.manual_seed(0)
    cls(config()).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_folder / name, folder / name)
    shutil.copy(TEMPLATES / f"{template}.jinja", folder / "chat_template.jinja")
    args = ("--model", str(folder), "--max-concurrent", "2", "--memory", "256MB")
    srv = start_server(model_folder, tmp_path_factory.mktemp(f"corral-{request.param}"), args)
    yield request.param, opener, srv
    stop_server(srv)


def test_a_json_schema_answer_validates(arch_server) -> None:
    arch, _, srv = arch_server
    r = srv.client().chat.completions.create(
        model=srv.model,
        messages=[{"role": "user", "content": "A person as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        max_tokens=60,
        temperature=0,
        # the think block of the families that think (Qwen3, SmolLM3) is bounded
        extra_body={"max_reasoning_tokens": 4} if arch in THINKING else None,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length"), (arch, choice)
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_a_required_call_comes_in_the_familys_format(arch_server) -> None:
    arch, opener, srv = arch_server
    r = srv.client().chat.completions.create(
        model=srv.model,
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: the grammar ends after it
        max_tokens=80,
        temperature=0,
        logprobs=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    choice = r.choices[0]
    written = "".join(t.token for t in choice.logprobs.content).lstrip()
    assert choice.finish_reason == "tool_calls", (arch, written)
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    if written.startswith("<think>"):  # SmolLM3's and Qwen3's empty block, when written
        written = written.split("</think>", 1)[1].lstrip()
    assert written.startswith(opener), (arch, written[:80])


def test_a_bad_request_is_a_400_on_each_architecture(arch_server) -> None:
    import openai

    _, _, srv = arch_server
    with pytest.raises(openai.BadRequestError):
        srv.client().chat.completions.create(
            model=srv.model,
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "p", "schema": {"type": "nonsense"}}},
        )  # fmt: skip
