"""``corral cache warm|stats|clear``: the compiled-constraint cache from the command line.

``corral.cli`` registers these with :func:`add_cache_commands`; ``python -m corral.cli_cache``
runs them on their own. Each handler takes the parsed arguments and returns an exit code.

``warm`` compiles each schema the way a request with it as ``response_format`` compiles
(``corral/warming.py``), so the server hits the entries: with ``--url``, in that running server
(``POST /v1/constraints``, its own cache tiers); otherwise in this process, for the tokenizer of
the model ``corral serve`` serves (the embedded default, or ``--model`` / ``$CORRAL_MODEL``) and
with the server's settings from the environment (``$CORRAL_OPEN_OBJECTS``, ...), into the disk
store the server reads. ``--tokenizer llama3`` warms for the fuzzer's and benchmarks' reference
tokenizer instead (it needs the fuzz extras). Entries are sealed under the key the server
checks them with: ``--cache-key-file`` (or ``$CORRAL_CACHE_KEY_FILE``), as given to ``corral
serve``, else the key generated in the cache folder.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.grammar import TokenizerInfo

_TOP_REASONS = 10


def add_cache_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``cache`` with its ``warm``, ``stats`` and ``clear`` sub-commands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="Corral's cache folder, like $CORRAL_CACHE_DIR (default ~/.cache/corral); "
        "entries live in its constraints/ folder",
    )
    cache = subparsers.add_parser("cache", help="manage the compiled-constraint cache")
    sub = cache.add_subparsers(dest="cache_command", required=True)

    warm = sub.add_parser(
        "warm", parents=[common], help="compile JSON schemas into the cache ahead of traffic"
    )
    warm.add_argument("paths", nargs="+", help="schema files, or folders searched for *.json")
    _add_tokenizer_choice(warm)
    warm.add_argument(
        "--api-key",
        default=os.environ.get("CORRAL_API_KEY") or None,
        help="the server's API key, with --url [env CORRAL_API_KEY]",
    )
    warm.add_argument(
        "--cache-key-file",
        default=os.environ.get("CORRAL_CACHE_KEY_FILE") or None,
        metavar="PATH",
        help="seal the entries under this key file, the one `corral serve --cache-key-file` "
        "reads (entries sealed under another key are recompiled by the server) [env "
        "CORRAL_CACHE_KEY_FILE] (default: the key generated in the cache folder)",
    )
    warm.add_argument("--lenient", action="store_true", help="compile in lenient mode")
    warm.add_argument("--deadline", type=float, default=None, help="compile deadline, seconds")
    warm.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    warm.set_defaults(handler=cmd_warm)

    stats = sub.add_parser(
        "stats", parents=[common], help="entries and bytes on disk, per tokenizer"
    )
    stats.set_defaults(handler=cmd_stats)

    clear = sub.add_parser("clear", parents=[common], help="delete every cached entry")
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    clear.set_defaults(handler=cmd_clear)


def _add_tokenizer_choice(warm: argparse.ArgumentParser) -> None:
    """``--model`` (the server's, by default) or ``--tokenizer llama3``: one tokenizer per run."""
    from corral.api.config import SETTINGS

    model_env = next(s.env for s in SETTINGS if s.field == "model")
    which = warm.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        default=os.environ.get(model_env) or None,
        metavar="PATH",
        help="warm for this model's tokenizer: a Hugging Face folder or .gguf file, as for "
        f"`corral serve --model` [env {model_env}] (default: the embedded SmolLM2-135M-Instruct)",
    )
    which.add_argument(
        "--url",
        default=None,
        help="compile in the running server at this URL (POST /v1/constraints) instead of in "
        "this process; --api-key or $CORRAL_API_KEY authenticates",
    )
    which.add_argument(
        "--tokenizer",
        choices=("llama3",),
        default=None,
        help="warm for Llama-3's tokenizer (128,256 logits), the fuzzer's default; "
        "needs the fuzz extras",
    )


def _config(args: argparse.Namespace, **overrides: object):
    from corral.base.paths import constraints_root
    from corral.schema_cache import CacheConfig

    overrides["root"] = constraints_root(args.cache_dir)
    return CacheConfig(**{k: v for k, v in overrides.items() if v is not None})


def cmd_warm(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from corral.schema_cache import CompileService
    from corral.schema_cache.warm import WarmReport, load_schemas, schema_files, warm
    from corral.warming import local_compiler, remote_compiler

    try:
        config = _config(args, compile_deadline_s=args.deadline, key_file=args.cache_key_file)
        files = schema_files(args.paths)
        server = None if args.url else _server_config(args)
        tok, tokenizer_name = (None, "") if args.url else _warm_tokenizer(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"corral cache warm: {e}", file=sys.stderr)
        return 2
    report = WarmReport()
    schemas = load_schemas(files, report)
    bar = tqdm(schemas, desc="compiling", unit="schema", disable=args.no_progress, file=sys.stderr)
    if args.url:
        warm(remote_compiler(args.url, args.api_key, not args.lenient), bar, report)
        _print_warm(report, len(files), f"the server at {args.url}", None, None)
        return 1 if report.errors else 0
    with CompileService(tok, config) as service:
        warm(local_compiler(service, server, not args.lenient), bar, report)
        stats = service.stats()
    where = f"{tokenizer_name} ({tok.fingerprint[:16]})"
    _print_warm(report, len(files), where, config.root, stats)
    return 1 if report.errors else 0


def _server_config(args: argparse.Namespace):
    """The settings ``corral serve`` would run with here (flags it was given are not known:
    the environment and the defaults), which shape a request's constraint."""
    from corral.api.config import ServerConfig

    return ServerConfig.from_sources(
        {"model": args.model, "cache_dir": args.cache_dir, "cache_key_file": args.cache_key_file}
    )


def _warm_tokenizer(args: argparse.Namespace) -> tuple[TokenizerInfo, str]:
    """The tokenizer to warm for, and what to call it in the report."""
    if args.tokenizer == "llama3":
        return _llama3_tokenizer(), "tokenizer llama3"
    model = f"model {args.model}" if args.model else "the default model"
    return _served_tokenizer(args.model, args.cache_dir), f"{model}'s tokenizer"


def _llama3_tokenizer() -> TokenizerInfo:
    """Llama-3's tokenizer from the fuzz extras, imported only when asked for."""
    try:
        from corral.fuzz.tokenizers import llama3_tokenizer

        return llama3_tokenizer()
    except ImportError as e:
        raise ValueError(
            f"--tokenizer llama3 needs the fuzz extras (pip install 'corral[fuzz]'): {e}"
        ) from None


def _served_tokenizer(model: str | None, cache_dir: Path | None = None) -> TokenizerInfo:
    """The tokenizer ``corral serve --model MODEL`` constrains with (``api/server.py``), built
    without loading the weights: same logits width and stop tokens, so the same fingerprint.

    A ``.gguf`` model (the default one included) has its config and tokenizer written into the
    model cache first, once, as the server does (no weights: it reads those from the GGUF).
    """
    from corral.engine.execution.model_config import ModelConfig
    from corral.engine.loading.assets import load_tokenizer, resolve_model_folder
    from corral.grammar import TokenizerInfo

    folder = resolve_model_folder(model, cache_dir, weights=False)
    config = ModelConfig.from_folder(folder)
    tok = load_tokenizer(folder, config)
    return TokenizerInfo.from_hf(
        tok.tokenizer, vocab_size=config.vocab_size, eos_token_ids=tok.eos_token_ids
    )


def _print_warm(report, n_files: int, target: str, root: Path | None, stats: dict | None) -> None:
    refused = sum(report.refused.values())
    errors = sum(report.errors.values())
    where = f"{target} in {root}" if root is not None else target
    print(
        f"{report.total} schemas from {n_files} files for {where}: "
        f"{report.compiled} compiled, {report.cached} already cached, {refused} refused, "
        f"{errors} errors"
    )
    if stats and (stats["deadline_hits"] or stats["corrupt_entries"]):
        print(
            f"{stats['deadline_hits']} compiles hit the deadline; "
            f"{stats['corrupt_entries']} cached entries were rejected (corrupt, or not sealed "
            "under this key) and recompiled"
        )
    for title, counter in (("refused", report.refused), ("errors", report.errors)):
        if counter:
            print(f"{title} (most common reasons):")
            for reason, n in counter.most_common(_TOP_REASONS):
                print(f"  {n:6d}  {reason}")
    for line in report.unreadable[:_TOP_REASONS]:
        print(f"unreadable: {line}")


def cmd_stats(args: argparse.Namespace) -> int:
    from corral.schema_cache import DiskStore
    from corral.schema_cache.stats import CacheStats

    config = _config(args)
    usage = DiskStore(config.root, config.max_disk_bytes, CacheStats()).usage()
    print(f"cache: {config.root}")
    print(f"entries: {usage.entries}")
    print(
        f"bytes: {usage.bytes} ({usage.bytes / 2**20:.1f} MiB of {config.max_disk_bytes / 2**20:.0f} MiB)"
    )
    for name, slot in sorted(usage.per_tokenizer.items()):
        print(f"  {name}: {slot['entries']} entries, {slot['bytes']} bytes")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from corral.schema_cache import DiskStore
    from corral.schema_cache.stats import CacheStats

    config = _config(args)
    store = DiskStore(config.root, config.max_disk_bytes, CacheStats())
    if not args.yes:
        usage = store.usage()
        if not sys.stdin.isatty():
            print("corral cache clear: pass --yes to delete without a prompt", file=sys.stderr)
            return 1
        answer = input(
            f"delete {usage.entries} entries ({usage.bytes} bytes) in {config.root}? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    removed = store.clear()
    print(f"deleted {removed} entries from {config.root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral")
    add_cache_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
