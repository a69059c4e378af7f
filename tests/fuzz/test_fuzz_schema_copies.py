"""Issue 19: a fuzz case tests the schema in the corpus file, not one a consumer rewrote.

hypothesis-jsonschema's ``from_schema`` rewrites the schema it is given in place (``$ref``s
resolved into the tree, ``_id`` keys added), and on 122 of 500 sampled schemas it did. These
tests run real cases over MaskBench schemas that it rewrites (``$ref`` into ``definitions``,
``allOf``, ``patternProperties``) and check what every stage compiled and every reproducer
saved; and they check that Corral's compile path never changes the schema it is given.
"""

from __future__ import annotations

import copy
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from corral.cli import main as corral_main
from corral.fuzz.casework import CaseConfig, run_case
from corral.fuzz.corpus import load_file
from corral.fuzz.strategies import schemas
from corral.fuzz.targets import Target, make_target
from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.schema.analysis import analyze_schema
from corral.grammar.schema.closed_objects import close_objects

#: Real MaskBench schemas that hypothesis-jsonschema rewrites in place, and that Corral compiles.
SLICE = (
    "Github_easy---o25976",  # allOf of two $refs into definitions (draft-04)
    "Github_easy---o17614",  # $ref into definitions (draft-07)
    "Github_easy---o67010",  # patternProperties whose values are $refs into definitions
    "Github_medium---o45264",  # $ref to a definition with an `id` and patternProperties
    "Github_easy---o88596",  # root `id`, patternProperties, oneOf of $refs, no extra keys
)


def file_schema(path: Path) -> Any:
    return json.loads(path.read_text())["schema"]


@pytest.fixture(scope="module")
def slice_dir(corpus, tmp_path_factory) -> Path:
    """The slice, copied into a folder of its own (the CLI takes a folder)."""
    src = corpus("maskbench")
    dst = tmp_path_factory.mktemp("slice") / "slice"
    dst.mkdir()
    for name in SLICE:
        shutil.copy(src / f"{name}.json", dst / f"{name}.json")
    return dst


class Recording:
    """A real target that writes down the stage and schema text of each compile it is asked
    for; compiling is left to the engine itself."""

    def __init__(self, inner: Target) -> None:
        self.name = inner.name
        self._inner = inner
        self.stage = ""
        self.compiled: list[tuple[str, str]] = []

    def compile(self, schema: Any) -> Any:
        self.compiled.append((self.stage, json.dumps(schema)))
        return self._inner.compile(schema)

    def matcher(self, handle: Any) -> Any:
        return self._inner.matcher(handle)


def test_a_case_hands_out_copies_of_its_schema(slice_dir):
    case = load_file(slice_dir / f"{SLICE[0]}.json")[0]
    mine = case.schema
    mine["properties"]["value"] = {"$ref": "#/definitions/Type1", "_id": 1}
    assert case.schema == file_schema(slice_dir / f"{SLICE[0]}.json")


def test_every_stage_of_a_case_sees_the_file_schema(slice_dir, view):
    targets = [Recording(make_target(n, view.tok)) for n in ("corral", "llguidance")]

    def stage(name: str) -> None:
        for t in targets:
            t.stage = name

    cfg = CaseConfig(walks=2, draws=8, mutations=4, shrink_seconds=1.0, slow_compile_s=0.0)
    for name in SLICE:
        path = slice_dir / f"{name}.json"
        want = file_schema(path)
        case = load_file(path)[0]
        result = run_case(case, targets, view, cfg, stage)
        assert case.schema == want, name
        for t in targets:
            at_compile = [text for s, text in t.compiled if s.startswith("compile:")]
            assert at_compile and all(json.loads(x) == want for x in at_compile), (name, t.name)
            t.compiled.clear()
        failures = [f for out in result.outcomes.values() for f in out.failures]
        assert failures, name  # slow-compile at a 0 s threshold, for each target that compiled
        for f in failures:
            assert f.original_schema == want, (name, f.target, f.kind)
            if not f.shrunk:
                assert f.schema == want, (name, f.target, f.kind)


def test_a_fuzz_run_saves_reproducers_of_the_file_schema(slice_dir, tmp_path):
    out = tmp_path / "found"
    args = (
        f"fuzz --target corral,llguidance --corpus {slice_dir} --budget {len(SLICE)} --jobs 0 "
        f"--walks 2 --draws 8 --mutations 4 --slow-compile 0 --no-shrink --no-progress "
        f"--out {out}"
    )
    assert corral_main(shlex.split(args)) in (0, 1)  # 1 would only mean a finding, checked below
    saved: dict[str, int] = {}
    for repro in out.rglob("*.json"):
        doc = json.loads(repro.read_text())
        name = doc["fuzz"]["case"].split("/")[-1]
        want = file_schema(slice_dir / f"{name}.json")
        assert doc["schema"] == want, repro
        assert doc["fuzz"]["original_schema"] == want, repro
        saved[name] = saved.get(name, 0) + 1
    assert set(saved) == set(SLICE)  # each schema compiled somewhere, so each left a slow-compile


def _compile_path_leaves_alone(schema: Any, tok: Any) -> None:
    before = copy.deepcopy(schema)
    for lenient in (False, True):
        try:
            analyze_schema(schema, lenient=lenient)
        except ConstraintError:
            pass
        assert schema == before, f"analyze_schema(lenient={lenient})"
    closed = close_objects(schema)
    assert schema == before, "close_objects"
    for s in (schema, closed):  # the closed form shares subtrees with the input
        try:
            analyze_schema(s, lenient=True)
            compile_constraint(ConstraintSpec.json_schema(s), tok)
        except ConstraintError:
            pass
        assert schema == before, "analysis or compile of close_objects(schema)"


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(schemas())
def test_the_compile_path_never_changes_its_input(view, schema):
    _compile_path_leaves_alone(schema, view.tok)


@pytest.mark.parametrize("name", SLICE)
def test_the_compile_path_leaves_the_slice_alone(slice_dir, view, name):
    _compile_path_leaves_alone(file_schema(slice_dir / f"{name}.json"), view.tok)
