"""The ``corral`` command: ``serve``, ``fleet``, ``cache`` and ``fuzz`` sub-commands.

Each package registers its own sub-commands; this module only wires them together, importing
each lazily so that ``corral cache stats`` does not load the model server.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral", description="Corral: a structured-generation LLM server."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from corral.cli_serve import add_serve_command

    add_serve_command(sub)
    from corral.cli_fleet import add_fleet_command

    add_fleet_command(sub)
    from corral.cli_cache import add_cache_commands

    add_cache_commands(sub)
    from corral.cli_fuzz import add_fuzz_command

    add_fuzz_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
