"""Prompt-lookup speculation through a real `corral serve`: the `speculative` request extension
on chat, completions, Responses and SGLang's /generate (a 400 for anything but a boolean), the
same output with it on and off, its `usage` extension and its /metrics counters."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

DOC = (
    "Shipping notice SN-88213. Sender: Harbourline Logistics, 41 Canal Walk, Rotterdam. "
    "Recipient: Ingrid Saarinen-Devereux, 7 Ulica Dluga, Krakow. Parcel contents: two "
    "noise-cancelling headsets and one USB-C docking station. Carrier reference: HLX-5530-ROT."
)
SCHEMA = {
    "type": "object",
    "properties": {"notice": {"type": "string"}, "sender": {"type": "string"},
                   "recipient": {"type": "string"}, "carrier_reference": {"type": "string"}},
    "required": ["notice", "sender", "recipient", "carrier_reference"],
    "additionalProperties": False,
}  # fmt: skip


def post(server, path: str, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    return httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=300)


def chat_body(server, **kw) -> dict:
    return {
        "model": server.model,
        "messages": [{"role": "user", "content": DOC + "\nExtract the notice's fields as JSON."}],
        "max_tokens": 120,
        "temperature": 0,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "n", "strict": True, "schema": SCHEMA}},
    } | kw  # fmt: skip


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_chat_same_output_on_and_off_with_usage_and_metrics(server):
    before = metric(server, "corral_speculative_proposed_tokens_total")
    on = post(server, "/v1/chat/completions", chat_body(server))
    assert on.status_code == 200, on.text[:500]
    off = post(server, "/v1/chat/completions", chat_body(server, speculative=False))
    assert off.status_code == 200, off.text[:500]
    on, off = on.json(), off.json()
    text = on["choices"][0]["message"]["content"]
    assert text == off["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), SCHEMA)
    spec = on["usage"]["speculative"]
    assert spec["proposed_tokens"] >= spec["accepted_tokens"] > 0
    assert spec["acceptance_rate"] == pytest.approx(
        spec["accepted_tokens"] / spec["proposed_tokens"]
    )
    assert "speculative" not in off["usage"]  # off: nothing proposed, nothing reported
    after = metric(server, "corral_speculative_proposed_tokens_total")
    assert after - before >= spec["proposed_tokens"]
    assert metric(server, "corral_speculative_accepted_tokens_total") > 0


def test_streamed_usage_carries_the_extension(server):
    body = chat_body(server, stream=True, stream_options={"include_usage": True})
    headers = {"Authorization": f"Bearer {server.api_key}"}
    usage = None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=300) as r:  # fmt: skip
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None and usage["speculative"]["accepted_tokens"] > 0


def test_completions_responses_and_generate_take_the_field(server):
    prompt = DOC + "\nThe carrier reference is"
    comp = {"model": server.model, "prompt": prompt, "max_tokens": 24, "temperature": 0}
    texts = []
    for spec in (True, False):
        r = post(server, "/v1/completions", comp | {"speculative": spec})
        assert r.status_code == 200, r.text[:500]
        texts.append(r.json()["choices"][0]["text"])
    assert texts[0] == texts[1]
    resp = {"model": server.model, "input": prompt, "max_output_tokens": 24, "temperature": 0}
    r = post(server, "/v1/responses", resp | {"speculative": False})
    assert r.status_code == 200, r.text[:500]
    assert "speculative" not in r.json()["usage"]
    gen = {"text": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
    outs = []
    for spec in (True, False):
        body = gen | {"sampling_params": gen["sampling_params"] | {"speculative": spec}}
        r = post(server, "/generate", body)
        assert r.status_code == 200, r.text[:500]
        outs.append(r.json()["text"])
    assert outs[0] == outs[1] == texts[0]


@pytest.mark.parametrize("value", ["false", 0, 1, "yes", [], {}, 0.5])
def test_a_non_boolean_is_a_400(server, value):
    checks = [
        ("/v1/chat/completions", chat_body(server, speculative=value)),
        ("/v1/completions", {"model": server.model, "prompt": "x", "speculative": value}),
        ("/v1/responses", {"model": server.model, "input": "x", "speculative": value}),
        ("/generate", {"text": "x", "sampling_params": {"speculative": value}}),
    ]
    for path, body in checks:
        r = post(server, path, body)
        assert r.status_code == 400, (path, value, r.text[:300])
        assert "speculative" in r.text


def test_the_server_flag_reaches_the_engine():
    import argparse

    from corral.api.config import ServerConfig
    from corral.cli_serve import add_serve_command

    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers(dest="command"))
    for argv, env, want in (
        ([], {}, True),
        (["--no-speculative"], {}, False),
        (["--speculative", "false"], {}, False),
        ([], {"CORRAL_SPECULATIVE": "0"}, False),
        (["--speculative", "true"], {"CORRAL_SPECULATIVE": "0"}, True),
    ):
        args = parser.parse_args(["serve", *argv])
        config = ServerConfig.from_sources(vars(args), env)
        assert config.engine_config().speculative is want, (argv, env)
