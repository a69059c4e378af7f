"""Dialects, and an exit status that means something: a run that judged nothing never passes.

The endpoints here are real HTTP servers written in the test, on 127.0.0.1: one refuses every
request the way llama-cpp-python refuses OpenAI's ``json_schema`` type (an HTTP 500 carrying
FastAPI's validation errors), one with an OpenAI-style 400. Corral's own server and
llama-cpp-python's are exercised in ``test_fuzz_url.py`` and ``test_fuzz_llama_cpp.py``.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from corral.cli import main as corral_main
from corral.fuzz.case import Case
from corral.fuzz.dialects import DIALECTS, hint
from corral.fuzz.dialects.base import ERROR, LENGTH, OK, REFUSED, Reply, Sampling
from corral.fuzz.judge import broken_keywords
from corral.fuzz.shrinkwork import shrink_output

#: llama-cpp-python 0.3.36's answer to ``response_format: {"type": "json_schema", ...}``.
LLAMA_CPP_REFUSAL = {
    "error": {
        "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
        "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\", "
        "'input': 'json_schema', 'ctx': {'expected': \"'text' or 'json_object'\"}}\n\n  File "
        '"llama_cpp/server/app.py", line 376, in create_chat_completion\n    POST '
        "/v1/chat/completions",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}
OPENAI_REFUSAL = {"error": {"message": "Unsupported schema", "type": "invalid_request_error"}}
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0}},
        "required": ["age"],
    },
    "color": {"enum": ["red", "green"]},
    "flag": {"type": "boolean"},
}


class _Refuser(BaseHTTPRequestHandler):
    status, body = 500, LLAMA_CPP_REFUSAL
    posts: list[dict]

    def _send(self, status: int, doc: object) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "refuser", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.posts.append({"path": self.path, **json.loads(self.rfile.read(length) or b"{}")})
        self._send(self.status, self.body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(status: int, body: dict) -> Iterator[tuple[str, list[dict]]]:
    posts: list[dict] = []
    handler = type("Handler", (_Refuser,), {"status": status, "body": body, "posts": posts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posts
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def llama_like():
    yield from _serve(500, LLAMA_CPP_REFUSAL)


@pytest.fixture
def openai_like():
    yield from _serve(400, OPENAI_REFUSAL)


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "schemas"
    d.mkdir()
    for name, schema in SCHEMAS.items():
        (d / f"{name}.json").write_text(json.dumps(schema))
    return d


def _fuzz(url: str, corpus, tmp_path, flags: str) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    rc = corral_main(
        shlex.split(
            f"fuzz --target {url} --corpus {corpus} --budget {len(SCHEMAS)} --samples 2 "
            f"--json {report} --out '' --no-progress {flags}"
        )
    )
    return rc, json.loads(report.read_text()) if report.exists() else {}


def test_an_endpoint_that_refuses_every_request_never_passes(llama_like, corpus, tmp_path, capsys):
    """The issue's run: OpenAI's form sent to a llama-cpp-python-like server; nothing judged."""
    url, posts = llama_like
    rc, report = _fuzz(url, corpus, tmp_path, "--dialect openai")
    err = capsys.readouterr().err
    assert rc == 3, err
    t = report["targets"][url]
    assert t["schemas"] == len(SCHEMAS) and t["judged"] == 0
    assert len(posts) == 2 * len(SCHEMAS)
    assert all(p["response_format"]["type"] == "json_schema" for p in posts)
    # the reason, once, with the dialect it points at
    (line,) = [ln for ln in err.splitlines() if "no schema was judged" in ln]
    assert f"({len(SCHEMAS)}×)" in line and "Input should be 'text' or 'json_object'" in line
    assert line.endswith("try --dialect llama-cpp")
    assert err.count("Input should be") == 1


def test_the_same_refusal_is_a_refusal_in_the_llama_cpp_dialect(llama_like, corpus, tmp_path):
    url, posts = llama_like
    rc, report = _fuzz(url, corpus, tmp_path, "--dialect llama-cpp")
    assert rc == 3
    t = report["targets"][url]
    assert t["status"] == {"refused": len(SCHEMAS)} and t["judged"] == 0
    assert {p["response_format"]["type"] for p in posts} == {"json_object"}
    assert all("schema" in p["response_format"] for p in posts)


def test_a_4xx_refusal_of_every_schema_exits_non_zero(openai_like, corpus, tmp_path, capsys):
    url, _ = openai_like
    rc, report = _fuzz(url, corpus, tmp_path, "--dialect openai")
    assert rc == 3
    assert report["targets"][url]["status"] == {"refused": len(SCHEMAS)}
    err = capsys.readouterr().err
    assert "no schema was judged" in err and "Unsupported schema" in err
    assert "try --dialect auto" in err


def test_auto_says_no_dialect_worked_and_why(llama_like, corpus, tmp_path, capsys):
    url, posts = llama_like
    rc, report = _fuzz(url, corpus, tmp_path, "--dialect auto")
    err = capsys.readouterr().err
    assert rc == 2 and report == {}
    assert "no request form constrained the probe" in err
    for name in ("openai", "llama-cpp", "llama-server", "vllm", "ollama", "sglang"):
        assert f"{name}: " in err, name
    # one probe per dialect that could be asked (Ollama's model list is missing here)
    assert len(posts) == len([n for n in DIALECTS if n not in ("tools", "ollama")])


def test_each_dialect_sends_the_schema_its_server_reads():
    schema, s = {"type": "integer", "minimum": 3}, Sampling(0.5, 32, 7)
    messages = [{"role": "user", "content": "hi"}]
    bodies = {name: d.body("m", messages, schema, s) for name, d in DIALECTS.items()}
    assert bodies["openai"]["response_format"]["json_schema"]["schema"] == schema
    assert bodies["llama-cpp"]["response_format"] == {"type": "json_object", "schema": schema}
    assert bodies["llama-server"]["json_schema"] == schema
    assert bodies["vllm"]["structured_outputs"] == {"json": schema}
    assert bodies["vllm-guided"]["guided_json"] == schema
    assert bodies["ollama"]["format"] == schema and bodies["ollama"]["stream"] is False
    assert bodies["ollama"]["options"] == {"temperature": 0.5, "num_predict": 32, "seed": 7}
    sg = bodies["sglang"]["sampling_params"]
    assert json.loads(sg["json_schema"]) == schema and sg["max_new_tokens"] == 32
    assert bodies["tools"]["tools"][0]["function"]["parameters"] == schema
    assert DIALECTS["ollama"].path == "/api/chat" and DIALECTS["sglang"].path == "/generate"


def test_each_dialect_reads_its_servers_answers():
    chat = json.dumps({"choices": [{"message": {"content": "7"}, "finish_reason": "stop"}]})
    cut = json.dumps({"choices": [{"message": {"content": "[1,"}, "finish_reason": "length"}]})
    llama = DIALECTS["llama-cpp"]
    assert llama.read(200, chat) == Reply(OK, "7") and llama.read(200, cut).kind == LENGTH
    assert llama.read(500, json.dumps(LLAMA_CPP_REFUSAL)).kind == REFUSED
    assert llama.read(500, '{"error": {"message": "boom"}}') == Reply(ERROR, "HTTP 500: boom")
    assert DIALECTS["openai"].read(500, json.dumps(LLAMA_CPP_REFUSAL)).kind == ERROR
    assert DIALECTS["openai"].read(200, "<html>").kind == ERROR
    ollama = DIALECTS["ollama"]
    done = {"message": {"role": "assistant", "content": "true"}, "done": True}
    assert ollama.read(200, json.dumps({**done, "done_reason": "stop"})) == Reply(OK, "true")
    assert ollama.read(200, json.dumps({**done, "done_reason": "length"})).kind == LENGTH
    assert ollama.read(400, '{"error": "invalid format"}') == Reply(
        REFUSED, "HTTP 400: invalid format"
    )
    sglang = DIALECTS["sglang"]
    meta = {"finish_reason": {"type": "stop", "matched": 2}}
    assert sglang.read(200, json.dumps({"text": "1", "meta_info": meta})) == Reply(OK, "1")
    abort = {"type": "abort", "message": "Invalid grammar request"}
    got = sglang.read(200, json.dumps({"text": "", "meta_info": {"finish_reason": abort}}))
    assert got.kind == REFUSED and "Invalid grammar" in got.text


def test_the_hint_names_the_dialect_a_refusal_points_at():
    reason = "HTTP 500: " + LLAMA_CPP_REFUSAL["error"]["message"]
    assert hint(reason, "openai") == "try --dialect llama-cpp"
    assert hint("HTTP 404: not found", "openai").startswith("try --dialect auto")
    assert hint("HTTP 404: not found", "openai", probed=True) == ""


def test_an_unsound_output_shrinks_to_the_keyword_the_server_dropped():
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "pets": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        },
        "required": ["name", "pets"],
    }
    output = '{"name": "Ann", "pets": [3, -4]}'
    f = Case.from_schema("c", schema).failure("url", "unsound", output, "invalid")
    shrink_output(f, seconds=5)
    assert f.shrunk and f.dropped == ("minimum",)
    # the part of the output under the hoisted subschema, its type kept so a resend asks for one
    assert f.schema == {"type": "integer", "minimum": 0} and f.text == "-4"
    assert f.original_schema == schema and f.original_text == output
    assert broken_keywords(f.schema, f.text) == ("minimum",)


def test_output_that_is_not_json_is_kept_as_found():
    f = Case.from_schema("c", {"type": "integer"}).failure("url", "unsound", "12 apples", "x")
    shrink_output(f, seconds=1)
    assert not f.shrunk and f.dropped == () and f.text == "12 apples"
