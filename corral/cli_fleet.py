"""``corral fleet``: N `corral serve` replicas behind one endpoint, on Ray Serve.

Every `corral serve` flag applies to each replica (and reads the same environment variable);
``--replicas``, ``--address`` and ``--cpus`` say where and how many.
"""

from __future__ import annotations

import argparse


def add_fleet_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``corral fleet``."""
    from corral.cli_serve import add_server_flags

    p = subparsers.add_parser(
        "fleet",
        help="serve a model from several replicas behind one endpoint (Ray Serve)",
        description="Run N replicas of `corral serve` as a Ray Serve application behind one "
        "OpenAI-compatible endpoint. A request goes to the replica that holds the longest "
        "prefix of its prompt and its compiled constraint, else to the least loaded one. "
        "Requires the `fleet` extra: pip install 'corral[fleet]'.",
    )
    p.add_argument("--replicas", type=int, default=2, help="replicas to run (default 2)")
    p.add_argument(
        "--address",
        default=None,
        help="an existing Ray cluster (auto, or ray://head:10001); default: start a local Ray",
    )
    p.add_argument(
        "--cpus",
        type=int,
        default=None,
        help="CPUs of the local Ray (default: this machine's cores, shared by the replicas)",
    )
    add_server_flags(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from corral.api.config import ServerConfig

    try:
        from corral.fleet.app import FleetConfig, run
    except ImportError as e:
        raise SystemExit(
            f"corral fleet: {e}; install it with pip install 'corral[fleet]'"
        ) from None
    try:
        config = FleetConfig(
            server=ServerConfig.from_sources(vars(args)),
            replicas=args.replicas,
            address=args.address,
            cpus=args.cpus,
        )
    except ValueError as e:
        raise SystemExit(f"corral fleet: {e}") from None
    return run(config)
