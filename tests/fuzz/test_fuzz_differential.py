"""`corral fuzz --differential`: two engines walked in lockstep, their masks compared token by
token, every sampled disagreement judged by completing it and validating with jsonschema.

With random walks and mutants turned off, nothing but the mask comparison can find the planted
engine: it must be found, convicted (not its sound twin) and shrunk."""

from __future__ import annotations

import json
import random

from jsonschema import Draft202012Validator
from test_fuzz_planted import ORDER, TREE, fuzz

from corral.fuzz.case import Case, CaseResult, TargetOutcome
from corral.fuzz.differential import DiffConfig, compare
from corral.fuzz.judge import Judge
from corral.fuzz.targets import drop_keyword, make_target

ONLY_MASKS = "--jobs 0 --walks 0 --mutations 0 --draws 6 --no-progress --differential"


def test_differential_mode_alone_finds_and_shrinks_the_planted_engine(tmp_path, capsys):
    d = tmp_path / "schemas"
    d.mkdir()
    (d / "order.json").write_text(json.dumps(ORDER))
    (d / "tree.json").write_text(json.dumps(TREE))
    report_path = tmp_path / "report.json"
    rc = fuzz(
        f"--target llguidance,llguidance-minus-maximum --corpus {d} --budget 2 --seed 3 "
        f"--out {tmp_path / 'found'} --json {report_path} {ONLY_MASKS}"
    )
    assert rc == 1
    assert "mask differences" in capsys.readouterr().out
    report = json.loads(report_path.read_text())
    pair = report["differential"]["llguidance|llguidance-minus-maximum"]
    assert pair["differing"] > 0 and pair["unsound"] > 0
    unsound = [f for f in report["failures"] if f["kind"] == "unsound"]
    assert unsound and {f["target"] for f in unsound} == {"llguidance-minus-maximum"}
    for f in unsound:
        assert f["detail"].startswith("mask difference"), f["detail"]
        assert f["shrunk"] and "maximum" in f["keywords"], f
        inst = json.loads(f["text"])
        assert not Draft202012Validator(f["schema"]).is_valid(inst)
        assert Draft202012Validator(drop_keyword(f["schema"], "maximum")).is_valid(inst)


def test_sound_engines_disagree_on_nothing_unsound(tmp_path):
    d = tmp_path / "schemas"
    d.mkdir()
    (d / "order.json").write_text(json.dumps(ORDER))
    report_path = tmp_path / "report.json"
    rc = fuzz(
        f"--target corral,llguidance --corpus {d} --budget 1 --seed 3 --out '' "
        f"--json {report_path} {ONLY_MASKS}"
    )
    report = json.loads(report_path.read_text())
    assert rc == 0
    assert report["differential"]["corral|llguidance"]["positions"] > 20
    assert not [f for f in report["failures"] if f["kind"] == "unsound"]


def test_a_disagreement_convicts_the_engine_the_judge_disagrees_with(view):
    """Directly on one instance path: every token the planted engine allows and the sound one
    does not is judged; the unsound completions convict the planted engine only."""
    sound, planted = (
        make_target("llguidance", view.tok),
        make_target("llguidance-minus-maximum", view.tok),
    )
    case = Case.from_schema("order", ORDER)
    result = CaseResult("order", "")
    result.outcomes = {t.name: TargetOutcome(t.name) for t in (sound, planted)}
    path = view.encode(json.dumps({"id": "ab", "qty": 7}))
    stats = compare(
        case, result, (sound, sound.compile(ORDER)), (planted, planted.compile(ORDER)), [path],
        Judge(ORDER), view, DiffConfig(judged_per_position=8), random.Random(0),
    )  # fmt: skip
    assert stats.positions >= len(path)  # the last, after the closing brace, when not terminated
    assert stats.differing >= 1 and stats.unsound >= 1 and stats.incomplete == 0
    assert not result.outcomes["llguidance"].failures
    (f,) = result.outcomes["llguidance-minus-maximum"].failures
    assert f.kind == "unsound" and json.loads(f.text)["qty"] > 10
