"""``corral serve``: the OpenAI-compatible server. Flags mirror ``corral.api.config.SETTINGS``."""

from __future__ import annotations

import argparse


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``corral serve``; every flag also reads its environment variable."""
    p = subparsers.add_parser(
        "serve",
        help="serve a model behind an OpenAI-compatible API",
        description="Serve a model behind an OpenAI-compatible API (chat, completions, "
        "response_format, tools). Each flag falls back to its environment variable.",
    )
    add_server_flags(p)
    p.set_defaults(handler=_run)


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``SETTINGS`` entry, None when not given (`corral serve` and `corral fleet`)."""
    from corral.api.config import SETTINGS

    for s in SETTINGS:
        parser.add_argument(
            s.flag, dest=s.field, type=s.parse, default=None, help=f"{s.help} [env {s.env}]"
        )
    parser.add_argument(
        "--no-cuda-graphs", dest="cuda_graphs", action="store_const", const=False,
        help="the same as --cuda-graphs false",
    )  # fmt: skip
    parser.add_argument(
        "--no-speculative", dest="speculative", action="store_const", const=False,
        help="the same as --speculative false",
    )  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    from corral.api.config import ServerConfig
    from corral.api.server import serve

    try:
        config = ServerConfig.from_sources(vars(args))
    except ValueError as e:
        raise SystemExit(f"corral serve: {e}") from None
    return serve(config)
