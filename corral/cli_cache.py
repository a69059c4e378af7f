"""``corral cache warm|stats|clear``: the compiled-constraint cache from the command line.

``corral.cli`` registers these with :func:`add_cache_commands`; ``python -m corral.cli_cache``
runs them on their own. Each handler takes the parsed arguments and returns an exit code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    warm.add_argument("--tokenizer", default="llama3", help="registered tokenizer (default llama3)")
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


def _config(args: argparse.Namespace, **overrides: object):
    from corral.schema_cache import CacheConfig

    if args.cache_dir is not None:
        overrides["root"] = Path(args.cache_dir) / "constraints"
    return CacheConfig(**{k: v for k, v in overrides.items() if v is not None})


def cmd_warm(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from corral.schema_cache import CompileService
    from corral.schema_cache.warm import WarmReport, load_specs, load_tokenizer, schema_files, warm

    config = _config(args, compile_deadline_s=args.deadline)
    try:
        files = schema_files(args.paths)
        tok = load_tokenizer(args.tokenizer)
    except (FileNotFoundError, ValueError) as e:
        print(f"corral cache warm: {e}", file=sys.stderr)
        return 2
    report = WarmReport()
    specs = load_specs(files, report, strict=not args.lenient)
    with CompileService(tok, config) as service:
        bar = tqdm(
            specs, desc="compiling", unit="schema", disable=args.no_progress, file=sys.stderr
        )
        warm(service, bar, report)
        stats = service.stats()
    _print_warm(report, len(files), args.tokenizer, config.root, stats)
    return 1 if report.errors else 0


def _print_warm(report, n_files: int, tokenizer: str, root: Path, stats: dict) -> None:
    refused = sum(report.refused.values())
    errors = sum(report.errors.values())
    print(
        f"{report.total} schemas from {n_files} files for tokenizer {tokenizer} in {root}: "
        f"{report.compiled} compiled, {report.cached} already cached, {refused} refused, "
        f"{errors} errors"
    )
    if stats["deadline_hits"] or stats["corrupt_entries"]:
        print(
            f"{stats['deadline_hits']} compiles hit the deadline; "
            f"{stats['corrupt_entries']} corrupt entries were recompiled"
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
