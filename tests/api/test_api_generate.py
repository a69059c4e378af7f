"""SGLang's native API on a real `corral serve`: /generate's shapes, constraints, logprobs,
streaming, batches and hostile bodies; /get_model_info, /get_server_info, /health_generate,
/flush_cache."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import jsonschema
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def post(server, body, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.post(server.url + "/generate", json=body, headers=headers, timeout=120, **kw)


def generate(server, body) -> dict | list:
    r = post(server, body)
    assert r.status_code == 200, r.text
    return r.json()


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_generate_text_answers_in_sglangs_shape(server):
    out = generate(server, {"text": "The capital of France is",
                            "sampling_params": {"max_new_tokens": 6, "temperature": 0}})  # fmt: skip
    meta = out["meta_info"]
    assert isinstance(out["text"], str) and out["text"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] == 5
    assert {"id", "cached_tokens", "e2e_latency"} <= set(meta)
    again = generate(server, {"input_ids": [504, 3575, 282, 4649, 314],
                              "sampling_params": {"max_new_tokens": 6, "temperature": 0}})  # fmt: skip
    assert again["text"] == out["text"]  # the same prompt as ids: the same greedy text


def test_constraints_hold_and_refusals_name_the_field(server):
    body = {"text": "Code:", "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                  "regex": "[A-Z]{3}-[0-9]{2}"}}  # fmt: skip
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", generate(server, body)["text"])
    body["sampling_params"] = {
        "max_new_tokens": 60,
        "temperature": 0,
        "json_schema": json.dumps(SCHEMA),
    }
    jsonschema.validate(json.loads(generate(server, body)["text"]), SCHEMA)
    body["sampling_params"] = {
        "max_new_tokens": 8,
        "temperature": 0,
        "ebnf": 'root ::= "yes" | "no"',
    }
    assert generate(server, body)["text"] in ("yes", "no")
    tag = {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f>"]}
    body["sampling_params"] = {"max_new_tokens": 4, "structural_tag": json.dumps(tag)}
    assert post(server, body).status_code == 200
    for field, value in [("regex", "(unclosed"), ("json_schema", '{"type": "nope"}'),
                         ("ebnf", "root ::= ("), ("structural_tag", "{not json")]:  # fmt: skip
        body["sampling_params"] = {"max_new_tokens": 4, field: value}
        r = post(server, body)
        assert r.status_code == 400, (field, r.text)
        assert r.json()["error"]["param"].startswith(f"sampling_params.{field}"), r.text


def test_prefill_only_caches_and_returns_prompt_logprobs(server):
    text = "A radix tree shares the prefixes of the prompts it holds, " * 3
    first = generate(server, {"text": text, "sampling_params": {"max_new_tokens": 0},
                              "return_logprob": True, "return_text_in_logprobs": True})  # fmt: skip
    meta = first["meta_info"]
    assert first["text"] == "" and meta["completion_tokens"] == 0
    entries = meta["input_token_logprobs"]
    assert len(entries) == meta["prompt_tokens"] and entries[0][0] is None
    assert all(isinstance(v, float) and v <= 0 for v, _, _ in entries[1:])
    assert "".join(t for _, _, t in entries) == text
    hits = metric(server, "corral_radix_cache_hit_tokens_total")
    second = generate(server, {"text": text + "Yes", "sampling_params": {"max_new_tokens": 1}})
    assert second["meta_info"]["cached_tokens"] >= meta["prompt_tokens"] - 1
    assert metric(server, "corral_radix_cache_hit_tokens_total") - hits >= meta["prompt_tokens"] - 1


def test_logprob_fields_and_batches(server):
    body = {"text": ["One, two,", "Red, green,"], "return_logprob": True, "top_logprobs_num": 2,
            "logprob_start_len": 1, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}  # fmt: skip
    outs = generate(server, body)
    assert isinstance(outs, list) and len(outs) == 2
    for out in outs:
        meta = out["meta_info"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == 3
        assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - 1
        assert all(v is not None and t is None for v, _, t in meta["input_token_logprobs"])
        assert all(len(top) == 2 for top in meta["output_top_logprobs"])
        # greedy: the chosen token is the most likely one
        for (v, tok, _), top in zip(
            meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
        ):
            assert top[0][1] == tok and abs(top[0][0] - v) < 1e-5
    past = post(server, {"text": "Hi", "return_logprob": True, "logprob_start_len": 50,
                         "sampling_params": {"max_new_tokens": 1}})  # fmt: skip
    assert past.status_code == 400 and past.json()["error"]["param"] == "logprob_start_len"
    n = generate(server, {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "n": 2}})
    assert isinstance(n, list) and len(n) == 2


def test_stream_sends_cumulative_text_then_done(server):
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    whole = generate(server, body)["text"]
    events = []
    headers = {"Authorization": f"Bearer {server.api_key}"}
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True},
                      headers=headers, timeout=120) as r:  # fmt: skip
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative
    assert texts[-1] == whole and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


# Each is answered in about 0.1 s on an idle machine; the bounds leave room for a machine shared
# by the whole suite (as tests/api/test_api_hostile.py does), the median must stay under 1 s.
ANSWER_S, MEDIAN_S, STALL_S = 5.0, 1.0, 2.0
HOSTILE = [
    ({"text": 5}, "text"),
    ({"text": "a", "sampling_params": {"max_new_tokens": "5"}}, "sampling_params"),
    ({"text": "a", "input_ids": [1, 2]}, "text"),
    ({"text": []}, "text"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [[]]}, "input_ids"),
    ({"input_ids": [1, 10**9]}, "input_ids"),
    ({"input_ids": [-1]}, "input_ids"),
    ({"text": "a", "return_logprob": True, "logprob_start_len": 99}, "logprob_start_len"),
    ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params"),
    ({"text": "a", "sampling_params": {"bogus": 1}}, "sampling_params"),
    ({"text": "a", "unknown_field": 1}, "unknown_field"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, "sampling_params"),
    ({"text": "a", "top_logprobs_num": 99}, "top_logprobs_num"),
]


def test_hostile_bodies_are_4xx_fast_while_health_answers(server):
    stop = threading.Event()
    health: list[float] = []

    def watch() -> None:
        while not stop.is_set():
            t = time.monotonic()
            assert httpx.get(server.url + "/health", timeout=5).status_code == 200
            health.append(time.monotonic() - t)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    took = []
    try:
        for body, param in HOSTILE:
            t = time.monotonic()
            r = post(server, body)
            took.append(time.monotonic() - t)
            assert r.status_code == 400, (body, r.text)
            assert took[-1] < ANSWER_S, body
            error = r.json()["error"]
            assert error["message"] and (error["param"] or "").startswith(param), (body, error)
        t = time.monotonic()
        big = post(server, {"text": "x" * (10 * 1024 * 1024)})
        took.append(time.monotonic() - t)
        assert big.status_code == 413 and "message" in big.json()["error"]
    finally:
        stop.set()
        watcher.join()
    assert sorted(took)[len(took) // 2] < MEDIAN_S and max(took) < ANSWER_S, took
    assert health and max(health) < STALL_S


def test_native_endpoints(server):
    headers = {"Authorization": f"Bearer {server.api_key}"}
    assert httpx.get(server.url + "/get_model_info", timeout=10).status_code == 401
    info = httpx.get(server.url + "/get_model_info", headers=headers, timeout=10).json()
    assert info["is_generation"] is True and info["model_path"]
    sinfo = httpx.get(server.url + "/get_server_info", headers=headers, timeout=10).json()
    assert sinfo["context_length"] > 0 and sinfo["internal_states"][0]["engine"] == "ok"
    assert (
        httpx.get(server.url + "/health_generate", headers=headers, timeout=60).status_code == 200
    )
    generate(server, {"text": "Flush me " * 20, "sampling_params": {"max_new_tokens": 0}})
    r = httpx.post(server.url + "/flush_cache", headers=headers, json={}, timeout=30)
    assert r.status_code == 200 and "flushed" in r.text
    assert metric(server, "corral_kv_cache_usage_ratio") == 0  # nothing else holds KV now


@pytest.mark.parametrize("path", ["/generate", "/flush_cache"])
def test_native_endpoints_need_the_key(server, path):
    r = httpx.post(server.url + path, json={"text": "a"}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["message"]
