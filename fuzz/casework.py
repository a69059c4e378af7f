"""Fuzzing one schema against in-process targets: compile, walk, check, shrink.

The steps, for one case: the judge labels the corpus instances and instances drawn from the
schema; each target compiles the schema and takes random walks through its masks (an output the
judge rejects is unsound); every valid output of any target joins the valid instances, and
one-edit mutations of valid instances that the judge rejects make the invalid ones; then every
target checks every instance token by token. ``stage(name)`` is called before each step that runs
engine code, so a supervisor can tell which target a crash or hang belongs to.

Schema copies: every stage reads ``case.schema``, a new copy each time (see :class:`Case`), so
neither the judge, nor hypothesis-jsonschema (which rewrites its input in place), nor a target
can change the schema that a later stage, a finding or the reproducer sees.
"""

from __future__ import annotations

import json
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.fuzz import case as K
from corral.fuzz.case import Case, CaseResult, TargetOutcome
from corral.fuzz.differential import DiffConfig, compare
from corral.fuzz.judge import (
    Judge,
    Unjudgeable,
    broken_keywords,
    dumps,
    judge_output,
    schema_keywords,
)
from corral.fuzz.keyorder import schema_order
from corral.fuzz.mutate import mutations
from corral.fuzz.probe import Check, TokenView, check_tokens, random_walk
from corral.fuzz.shrinkwork import shrink_failure
from corral.fuzz.targets import Refused, Target


@dataclass(frozen=True)
class CaseConfig:
    """Per-schema effort and thresholds (the CLI fills it from its flags)."""

    walks: int = 8
    max_walk_tokens: int = 200
    draws: int = 8
    mutations: int = 16
    max_instances: int = 40  # valid and invalid each, per target
    max_text_chars: int = 2000
    shrink: bool = True
    shrink_seconds: float = 6.0
    slow_compile_s: float = 2.0
    slow_mask_s: float = 0.05
    differential: DiffConfig | None = None  # compare every pair of engines' masks (`differential`)


def open_case(case: Case) -> tuple[CaseResult, Judge | None]:
    """A case's result, begun: its keywords and its judge, or no judge (the reason in the
    result's note) when ``jsonschema`` cannot judge the schema. Every target kind starts here."""
    result = CaseResult(case.id, case.source)
    try:
        judge = Judge(case.schema)
    except Unjudgeable as e:
        result.judged, result.note = False, str(e)[:300]
        return result, None
    result.keywords = tuple(sorted(schema_keywords(case.schema)))
    return result, judge


def run_case(
    case: Case,
    targets: list[Target],
    view: TokenView,
    cfg: CaseConfig,
    stage: Callable[[str], None] = lambda s: None,
    skip_draws: bool = False,
) -> CaseResult:
    result, judge = open_case(case)
    if judge is None:
        return result
    rng = random.Random(case.seed)
    stage("draw")
    valid, invalid = _label(judge, [d for d, _ in case.tests])
    if cfg.draws and not skip_draws:
        v, i = _label(judge, _draw(case, cfg.draws))
        valid, invalid = valid + v, invalid + i
    compiled: dict[str, tuple[Target, Any]] = {}
    for t in targets:
        out = result.outcomes[t.name] = TargetOutcome(t.name)
        handle = _compile(t, case, out, stage)
        if handle is not None:
            out.judged = True
            compiled[t.name] = (t, handle)
            stage(f"walk:{t.name}")
            valid += _walks(t, handle, case, judge, view, cfg, out)
    valid = _texts(_dedup(valid), rng, cfg)
    muts = _mutants(judge, valid, rng, cfg.mutations)
    invalid = _texts(_dedup(invalid + muts), rng, cfg)
    result.n_valid, result.n_invalid = len(valid), len(invalid)
    encoded = {s: view.encode(s) for s in valid + invalid}
    if cfg.differential is not None:
        _differential(
            case, result, list(compiled.values()), valid, encoded, judge, view, cfg, stage
        )
    for name, (t, handle) in compiled.items():
        stage(f"check:{name}")
        _check(t, handle, case, judge, view, valid, invalid, encoded, result.outcomes[name])
        _outliers(case, cfg, result.outcomes[name])
        if cfg.shrink:
            stage(f"shrink:{name}")
            todo = [f for f in result.outcomes[name].failures if f.shrinkable]
            for f in todo:  # the shrink budget is per target and case, shared by its findings
                shrink_failure(f, t, view, cfg.shrink_seconds / len(todo), handle)
    for out in result.outcomes.values():
        for f in out.failures:
            f.keywords = f.keywords or tuple(sorted(schema_keywords(f.schema)))
            if f.kind == K.UNSOUND and f.text is not None:
                f.dropped = broken_keywords(f.schema, f.text)
    return result


def _differential(
    case: Case,
    result: CaseResult,
    compiled: list[tuple[Target, Any]],
    valid: list[str],
    encoded: dict[str, list[int]],
    judge: Judge,
    view: TokenView,
    cfg: CaseConfig,
    stage: Callable[[str], None],
) -> None:
    """Every pair of compiled engines walked in lockstep along the valid instances (in schema
    key order, as the engines lay keys out), their masks compared (`differential`)."""
    schema = case.schema
    paths = []
    for text in valid:
        ordered = _in_schema_order(schema, text)
        paths.append(encoded[ordered] if ordered in encoded else view.encode(ordered))
    for i, a in enumerate(compiled):
        for b in compiled[i + 1 :]:
            stage(f"differential:{a[0].name}|{b[0].name}")
            rng = random.Random(case.seed * 31 + i)
            result.diff[f"{a[0].name}|{b[0].name}"] = compare(
                case, result, a, b, paths, judge, view, cfg.differential, rng
            )


def _compile(t: Target, case: Case, out: TargetOutcome, stage: Callable[[str], None]) -> Any:
    stage(f"compile:{t.name}")
    t0 = time.perf_counter()
    try:
        handle = t.compile(case.schema)
    except Refused as e:
        out.status, out.reason = "refused", str(e)[:300]
        return None
    except Exception as e:  # anything but a refusal is an engine bug
        out.status, out.reason = "error", f"{type(e).__name__}: {e}"[:300]
        _add(out, case, K.ERROR, None, out.reason)
        return None
    out.compile_s = time.perf_counter() - t0
    return handle


def _walks(
    t: Target,
    handle: Any,
    case: Case,
    judge: Judge,
    view: TokenView,
    cfg: CaseConfig,
    out: TargetOutcome,
) -> list[Any]:
    """Random walks; returns the valid outputs, records unsound ones and engine faults."""
    good = []
    for i in range(cfg.walks):
        w = random_walk(
            t.matcher(handle),
            view,
            random.Random(case.seed * 7919 + i),
            cfg.max_walk_tokens,
            out.mask,
        )
        out.walks[w.outcome] = out.walks.get(w.outcome, 0) + 1
        text = w.text.decode("utf-8", errors="replace")
        if w.outcome in ("mismatch", "beyond-vocab"):
            _add(out, case, K.MISMATCH, text, w.detail)
        elif w.outcome == "dead-end":
            detail = f"no token allowed after {w.tokens} tokens, and EOS not allowed either"
            _add(out, case, K.DEAD_END, text, detail)
        elif w.outcome in ("eos", "terminated"):
            judged = judge_output(judge, w.text)
            if judged is None:
                continue
            value, problem = judged
            if problem:
                out.walks["invalid"] = out.walks.get("invalid", 0) + 1
                detail = f"a random walk produced an invalid instance: {problem}"
                replayable = not problem.startswith("not UTF-8")
                if not replayable:  # show the bad bytes; they cannot be replayed
                    text = w.text.decode("utf-8", errors="backslashreplace")
                _add(out, case, K.UNSOUND, text, detail, shrinkable=replayable)
            else:
                good.append(value)
    return good


def _check(
    t: Target,
    handle: Any,
    case: Case,
    judge: Judge,
    view: TokenView,
    valid: list[str],
    invalid: list[str],
    encoded: dict[str, list[int]],
    out: TargetOutcome,
) -> None:
    def accepts(text: str) -> Check:
        if text not in encoded:
            encoded[text] = view.encode(text)
        return check_tokens(t.matcher(handle), view, encoded[text], out.mask)

    schema = case.schema  # this stage's copy, read for key order only
    for text in valid:
        out.valid_checked += 1
        ordered = _in_schema_order(schema, text)
        c = accepts(ordered)
        if not c.accepted:
            out.valid_rejected += 1
            detail = f"a valid instance was refused: {c.detail}"
            _add(out, case, K.INCOMPLETE, ordered, detail)
        elif ordered != text and not (c := accepts(text)).accepted:
            detail = f"a valid instance was refused unless its keys are in schema order: {c.detail}"
            _add(out, case, K.KEY_ORDER, text, detail, shrinkable=False)
    for text in invalid:
        out.invalid_checked += 1
        ordered = _in_schema_order(schema, text)
        hit = ordered if accepts(ordered).accepted else None
        if hit is None and ordered != text and accepts(text).accepted:
            hit = text
        if hit is not None:
            out.invalid_accepted += 1
            detail = f"an invalid instance was accepted: {judge.error(json.loads(hit))}"
            _add(out, case, K.UNSOUND, hit, detail)


def _in_schema_order(schema: Any, text: str) -> str:
    try:
        return dumps(schema_order(schema, json.loads(text)))
    except (ValueError, RecursionError):
        return text


def _outliers(case: Case, cfg: CaseConfig, out: TargetOutcome) -> None:
    if out.compile_s > cfg.slow_compile_s:
        detail = f"compile took {out.compile_s:.2f} s (threshold {cfg.slow_compile_s} s)"
        _add(out, case, K.SLOW_COMPILE, None, detail)
    if out.mask.max > cfg.slow_mask_s:
        detail = f"a mask took {out.mask.max * 1e3:.1f} ms (threshold {cfg.slow_mask_s * 1e3} ms)"
        _add(out, case, K.SLOW_MASK, None, detail)


def _add(
    out: TargetOutcome,
    case: Case,
    kind: str,
    text: str | None,
    detail: str,
    shrinkable: bool = True,
) -> None:
    """Keep the first failure of each kind per target and case (counts are kept elsewhere)."""
    if kind not in out.kinds():
        out.failures.append(case.failure(out.target, kind, text, detail, shrinkable))


def _label(judge: Judge, instances: list[Any]) -> tuple[list[Any], list[Any]]:
    valid, invalid = [], []
    for x in instances:
        try:
            (valid if judge.is_valid(x) else invalid).append(x)
        except Unjudgeable:
            continue
    return valid, invalid


def _draw(case: Case, n: int) -> list[Any]:
    """Instances drawn by hypothesis-jsonschema; [] for schemas it cannot handle.

    ``from_schema`` rewrites the schema it is given in place (``$ref``s resolved into the tree,
    ``_id`` keys added, definitions merged): it gets a copy that nothing else reads."""
    from hypothesis_jsonschema import from_schema

    from corral.fuzz.strategies import draw_examples

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return draw_examples(from_schema(case.schema), n, case.seed)
    except Exception:  # unsupported keywords, unsatisfiable schemas, recursive refs, ...
        return []


def _dedup(values: list[Any]) -> list[str]:
    texts: dict[str, None] = {}
    for v in values:
        try:
            texts[dumps(v)] = None
        except (ValueError, TypeError):  # a non-finite float has no JSON text
            continue
    return list(texts)


def _mutants(judge: Judge, valid: list[str], rng: random.Random, total: int) -> list[Any]:
    """About ``total`` invalid one-edit mutants, spread over the valid instances."""
    out: list[Any] = []
    per = max(1, -(-total // max(1, len(valid))))
    for v in valid:
        if len(out) >= total:
            break
        out += mutations(judge, json.loads(v), rng, per)
    return out


def _texts(texts: list[str], rng: random.Random, cfg: CaseConfig) -> list[str]:
    texts = [t for t in texts if len(t) <= cfg.max_text_chars]
    if len(texts) > cfg.max_instances:
        texts = rng.sample(texts, cfg.max_instances)
    return texts
