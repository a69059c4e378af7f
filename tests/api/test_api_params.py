"""No silent parameter, against a real `corral serve`.

Every OpenAI request field is honoured or refused by name; any other field is a 400 naming it;
types are strict. vLLM's and SGLang's extensions do what their documentation says: each
constraint field constrains the output (judged by jsonschema, the regex or the grammar's
sentences), and each sampling field changes the output as documented.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

CHOICES = ["zebra-7", "quokka-9"]  # words an unconstrained answer does not consist of
PATTERN = "[0-9]{3}-[a-z]{2}"
SCHEMA = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["age"],
    "additionalProperties": False,
}
EBNF = 'root ::= "zebra-7" | "quokka-9"'
LARK = 'start: "zebra-7" | "quokka-9"'


def post(server, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    # json.dumps escapes non-ASCII (a lone surrogate too), as a client's JSON encoder would
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    return httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=120)


def chat(server, content: str = "Answer.", **kw) -> dict:
    return {"model": server.model, "messages": [{"role": "user", "content": content}]} | kw


def completion(server, prompt: str = "Answer:", **kw) -> dict:
    return {"model": server.model, "prompt": prompt} | kw


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text[:800]
    return r.json()


def error(r: httpx.Response, param: str | None = None) -> dict:
    assert r.status_code == 400, r.text[:800]
    err = r.json()["error"]
    if param is not None:
        assert err["param"] == param, err
        assert param.split(".")[0].split("[")[0] in err["message"], err
    return err


def text_of(reply: dict) -> str:
    choice = reply["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


# -- the request schema --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_unknown_field_is_refused_by_name(server, path: str) -> None:
    body = chat(server) if "chat" in path else completion(server)
    err = error(post(server, body | {"max_tokens": 2, "frobnicate": True}, path), "frobnicate")
    assert "Unrecognized request argument supplied: frobnicate" in err["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", "5"), ("stream", "true"), ("n", "1"), ("temperature", "0.5"),
     ("logprobs", 1), ("top_k", "1"), ("ignore_eos", "false"), ("max_tokens", 5.0)],
)  # fmt: skip
def test_types_are_strict(server, field: str, value: object) -> None:
    body = chat(server, max_tokens=2) | {field: value}
    error(post(server, body), field)


def test_an_integer_is_a_number_and_null_is_absent(server) -> None:
    body = chat(server, max_tokens=2, temperature=0, top_p=1, presence_penalty=0)
    body |= {"stop": None, "seed": None, "user": None, "tools": None, "top_k": None}
    assert ok(post(server, body))["choices"][0]["finish_reason"] in ("stop", "length")


ACCEPTED = [
    {"user": "u-1"}, {"metadata": {"team": "a"}}, {"store": False}, {"service_tier": "auto"},
    {"prompt_cache_key": "k"}, {"safety_identifier": "s"}, {"modalities": ["text"]},
    {"prompt_cache_retention": "in-memory"}, {"parallel_tool_calls": False},
    {"stream_options": {"include_usage": True, "include_obfuscation": False}, "stream": True},
    {"guided_decoding_backend": "auto"}, {"skip_special_tokens": False},
    {"include_stop_str_in_output": False}, {"logit_bias": {}},
]  # fmt: skip


@pytest.mark.parametrize("fields", ACCEPTED, ids=lambda f: next(iter(f)))
def test_fields_that_do_not_change_the_output_are_accepted(server, fields: dict) -> None:
    r = post(server, chat(server, max_tokens=2) | fields)
    assert r.status_code == 200, r.text[:500]


REFUSED = [
    ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}), ("web_search_options", {}),
    ("reasoning_effort", "low"), ("verbosity", "low"), ("store", True),
    ("service_tier", "flex"), ("prompt_cache_retention", "24h"),
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]), ("function_call", "auto"),
    ("logit_bias", {"50256": -100}), ("include_stop_str_in_output", True),
    ("guided_decoding_backend", "xgrammar"), ("guided_whitespace_pattern", "[ ]?"),
    ("stream_options", {"include_usage": True}),  # without stream: true
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f for f, _ in REFUSED])
def test_fields_that_cannot_be_honoured_are_refused_by_name(server, field, value) -> None:
    error(post(server, chat(server, max_tokens=2) | {field: value}), field)


def test_openapi_describes_every_field(server) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]
    chat_props = schemas["ChatCompletionRequest"]["properties"]
    for field in ("guided_json", "guided_choice", "structured_outputs", "regex", "json_schema",
                  "ebnf", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                  "stop_token_ids", "prediction", "web_search_options", "metadata"):  # fmt: skip
        assert field in chat_props, field
    assert "guided_regex" in schemas["CompletionRequest"]["properties"]
    assert schemas["ChatCompletionRequest"].get("additionalProperties") is False


# -- constraint dialects -------------------------------------------------------------------------


def _choice(text: str) -> bool:
    return text in CHOICES


def _regex(text: str) -> bool:
    return re.fullmatch(PATTERN, text) is not None


def _schema(text: str) -> bool:
    jsonschema.validate(json.loads(text), SCHEMA)
    return True


DIALECTS = [
    ({"guided_choice": CHOICES}, _choice),
    ({"guided_regex": PATTERN}, _regex),
    ({"guided_json": SCHEMA}, _schema),
    ({"guided_json": json.dumps(SCHEMA)}, _schema),
    ({"guided_grammar": EBNF}, _choice),
    ({"guided_grammar": LARK}, _choice),
    ({"structured_outputs": {"choice": CHOICES}}, _choice),
    ({"structured_outputs": {"regex": PATTERN}}, _regex),
    ({"structured_outputs": {"json": SCHEMA}}, _schema),
    ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": False}}, _schema),
    ({"structured_outputs": {"grammar": LARK}}, _choice),
    ({"regex": PATTERN}, _regex),
    ({"json_schema": json.dumps(SCHEMA)}, _schema),
    ({"ebnf": EBNF}, _choice),
]


DIALECT_IDS = [
    "guided_choice", "guided_regex", "guided_json", "guided_json-text", "guided_grammar-ebnf",
    "guided_grammar-lark", "so.choice", "so.regex", "so.json", "so.json-whitespace",
    "so.grammar", "sglang-regex", "sglang-json_schema", "sglang-ebnf",
]  # fmt: skip


@pytest.mark.parametrize(("fields", "judge"), DIALECTS, ids=DIALECT_IDS)
def test_each_dialect_constrains_the_chat_output(server, fields: dict, judge) -> None:
    body = chat(server, "Write a short sentence about the sea.", max_tokens=24, temperature=0)
    reply = ok(post(server, body | fields))
    assert reply["choices"][0]["finish_reason"] == "stop", reply
    assert judge(text_of(reply)), text_of(reply)


@pytest.mark.parametrize(("fields", "judge"), DIALECTS[:3], ids=DIALECT_IDS[:3])
def test_each_dialect_constrains_completions(server, fields: dict, judge) -> None:
    body = completion(server, "The sea is", max_tokens=24, temperature=0)
    reply = ok(post(server, body | fields, "/v1/completions"))
    assert judge(text_of(reply)), text_of(reply)


def test_json_object_from_structured_outputs(server) -> None:
    body = chat(server, "Say hello.", max_tokens=8, temperature=0)
    text = text_of(ok(post(server, body | {"structured_outputs": {"json_object": True}})))
    assert text.startswith("{"), text


def test_a_streamed_dialect_constraint(server) -> None:
    body = chat(server, "Pick one.", max_tokens=10, stream=True, guided_choice=CHOICES)
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {server.api_key}"}) as r:  # fmt: skip
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text in CHOICES


def test_a_bad_dialect_constraint_names_its_field(server) -> None:
    err = error(post(server, chat(server, guided_regex="([a-z]")), "guided_regex")
    assert err["code"] == "invalid_constraint"
    err = error(post(server, chat(server, structured_outputs={"grammar": "root ::= ("})))
    assert err["param"] == "structured_outputs.grammar", err


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json"),
     ({"guided_regex": PATTERN, "guided_choice": CHOICES}, "guided_choice"),
     ({"regex": PATTERN, "structured_outputs": {"choice": CHOICES}}, "structured_outputs.choice"),
     ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
     ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag")],
)  # fmt: skip
def test_two_constraints_or_an_unsupported_option_are_refused(server, fields, param) -> None:
    error(post(server, chat(server, max_tokens=4) | fields), param)


def test_a_constraint_cannot_sit_beside_tools_in_play(server) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = chat(server, max_tokens=4, tools=[tool], guided_choice=CHOICES)
    error(post(server, body), "guided_choice")
    ok(post(server, body | {"tool_choice": "none"}))  # tools out of play: the choice constrains


# -- sampling extensions -------------------------------------------------------------------------


def _sentence(server, **kw) -> dict:
    body = chat(server, "Write a sentence about cats.", max_tokens=16) | kw
    return ok(post(server, body))


def test_top_k_1_and_min_p_1_are_greedy(server) -> None:
    greedy = text_of(_sentence(server, temperature=0))
    for seed in (1, 2):
        assert text_of(_sentence(server, temperature=1.5, top_k=1, seed=seed)) == greedy
        assert text_of(_sentence(server, temperature=1.5, min_p=1.0, seed=seed)) == greedy


def test_ignore_eos_and_min_tokens_give_that_many_tokens(server) -> None:
    body = chat(server, "Reply with just the word OK.", max_tokens=40, temperature=0)
    natural = ok(post(server, body))
    assert natural["usage"]["completion_tokens"] < 30, natural  # the model stops early
    ignored = ok(post(server, body | {"ignore_eos": True}))
    assert ignored["usage"]["completion_tokens"] == 40
    assert ignored["choices"][0]["finish_reason"] == "length"
    at_least = ok(post(server, body | {"min_tokens": 30}))
    assert at_least["usage"]["completion_tokens"] >= 30


def test_min_tokens_above_max_tokens_is_refused(server) -> None:
    error(post(server, chat(server, max_tokens=4, min_tokens=5)), "min_tokens")


def test_repetition_penalty_changes_the_output_and_is_bounded(server) -> None:
    greedy = text_of(_sentence(server, temperature=0))
    penalized = text_of(_sentence(server, temperature=0, repetition_penalty=2.0))
    assert penalized != greedy
    assert text_of(_sentence(server, temperature=0, repetition_penalty=1.0)) == greedy
    for bad in (0, -1, 2.5):
        error(
            post(server, chat(server, max_tokens=2, repetition_penalty=bad)), "repetition_penalty"
        )


def test_stop_token_ids_end_the_output(server, smol_tokenizer) -> None:
    body = chat(server, "List five colours, one per line.", max_tokens=16, temperature=0)
    greedy = text_of(ok(post(server, body)))
    assert "\n" in greedy.strip(), greedy
    (newline,) = smol_tokenizer.encode("\n", add_special_tokens=False)
    reply = ok(post(server, body | {"stop_token_ids": [newline]}))
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert greedy.startswith(text_of(reply)) and "\n" not in text_of(reply)
    vocab = len(smol_tokenizer)
    error(post(server, chat(server, max_tokens=2, stop_token_ids=[vocab])), "stop_token_ids[0]")
