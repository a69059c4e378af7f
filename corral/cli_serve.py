"""``corral serve``: the OpenAI-compatible server. Flags mirror ``corral.api.config.SETTINGS``."""

from __future__ import annotations

import argparse


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``corral serve``; every flag also reads its environment variable."""
    from corral.api.config import SETTINGS

    p = subparsers.add_parser(
        "serve",
        help="serve a model behind an OpenAI-compatible API",
        description="Serve a model behind an OpenAI-compatible API (chat, completions, "
        "response_format, tools). Each flag falls back to its environment variable.",
    )
    for s in SETTINGS:
        p.add_argument(
            s.flag, dest=s.field, type=s.parse, default=None, help=f"{s.help} [env {s.env}]"
        )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from corral.api.config import ServerConfig
    from corral.api.server import serve

    try:
        config = ServerConfig.from_sources(vars(args))
    except ValueError as e:
        raise SystemExit(f"corral serve: {e}") from None
    return serve(config)
