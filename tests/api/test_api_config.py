"""ServerConfig: flags over environment over defaults, memory sizes, validation, the CLI flags."""

from __future__ import annotations

import argparse

import pytest

from corral.api.config import SETTINGS, ServerConfig, parse_bool, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2", 2 << 30), ("0.5", 1 << 29), ("512MB", 512 << 20), ("512MiB", 512 << 20),
     ("2GB", 2 << 30), ("1073741824", 1 << 30), ("4096B", 4096)],
)  # fmt: skip
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1", "0"])
def test_parse_bytes_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_flags_override_environment_which_overrides_defaults() -> None:
    env = {"CORRAL_PORT": "9001", "CORRAL_HOST": "0.0.0.0", "CORRAL_MEMORY_GB": "2"}
    config = ServerConfig.from_sources({"port": 9100, "host": None}, env)
    assert config.port == 9100  # flag wins
    assert config.host == "0.0.0.0"  # environment
    assert config.memory_bytes == 2 << 30
    assert config.queue_limit == ServerConfig().queue_limit  # default


def test_the_engine_is_built_from_the_server_config() -> None:
    """`corral serve` and `bench/engine.py` both take the engine's sizes from here."""
    config = ServerConfig.from_sources({"memory_bytes": 3 << 29, "max_concurrent": 5}, {})
    engine = config.engine_config()
    assert (engine.kv_cache_bytes, engine.max_num_seqs) == (3 << 29, 5)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="CORRAL_MAX_CONCURRENT"):
        ServerConfig.from_sources({}, {"CORRAL_MAX_CONCURRENT": "many"})


@pytest.mark.parametrize("kw", [{"port": 70000}, {"max_concurrent": 0}, {"queue_limit": -1}])
def test_invalid_config_is_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        ServerConfig(**kw)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("1", True), ("Yes", True), ("on", True),
     ("false", False), ("0", False), ("NO", False), ("off", False)],
)  # fmt: skip
def test_parse_bool(text: str, expected: bool) -> None:
    assert parse_bool(text) is expected


def test_open_objects_defaults_to_closed_and_reads_its_variable() -> None:
    assert ServerConfig().open_objects is False
    assert ServerConfig.from_sources({}, {"CORRAL_OPEN_OBJECTS": "true"}).open_objects is True
    with pytest.raises(ValueError, match="CORRAL_OPEN_OBJECTS"):
        ServerConfig.from_sources({}, {"CORRAL_OPEN_OBJECTS": "sometimes"})


def test_empty_api_key_means_no_key() -> None:
    assert ServerConfig(api_key="").api_key is None


def test_serve_command_has_a_flag_per_setting() -> None:
    from corral.cli_serve import add_serve_command

    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "8123", "--memory", "1GB", "--api-key", "k"])
    assert callable(args.handler)
    assert (args.port, args.memory_bytes, args.api_key) == (8123, 1 << 30, "k")
    assert all(
        getattr(args, s.field) is None
        for s in SETTINGS
        if s.field not in {"port", "memory_bytes", "api_key"}
    )
    # every setting has a distinct flag and environment variable
    assert len({s.flag for s in SETTINGS}) == len({s.env for s in SETTINGS}) == len(SETTINGS)


def test_the_request_limits_have_flags_and_variables() -> None:
    from corral.cli_serve import add_serve_command

    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["serve", "--max-n", "3", "--max-schema-depth", "10", "--max-schema-bytes", "2KB",
         "--max-tools", "4", "--compile-workers", "3", "--compile-deadline", "2.5"]
    )  # fmt: skip
    config = ServerConfig.from_sources(vars(args), {"CORRAL_MAX_ENUM_VALUES": "7"})
    assert (config.max_n, config.max_schema_depth, config.max_schema_bytes) == (3, 10, 2048)
    assert (config.max_tools, config.compile_workers, config.compile_deadline_s) == (4, 3, 2.5)
    assert config.max_enum_values == 7  # from its environment variable


@pytest.mark.parametrize(
    "kw", [{"max_n": 0}, {"max_tools": 0}, {"max_schema_depth": 0}, {"compile_deadline_s": 0}]
)
def test_limits_must_be_positive(kw: dict) -> None:
    with pytest.raises(ValueError):
        ServerConfig(**kw)
