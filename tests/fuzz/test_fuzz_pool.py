"""Crash/hang containment: in-process targets run in supervised worker processes."""

from __future__ import annotations

import json
import shlex

from corral.cli import main as corral_main

# xgrammar's compile time grows steeply with this bounded repetition (about 4 s at {1500,3000}
# and 110 s at {6000,12000} on the development machine); llguidance and Corral compile it in
# milliseconds. With a one-second step limit xgrammar counts as hung.
SLOW = {"type": "string", "pattern": "^(a|b){3000,6000}$"}


def test_a_hung_target_is_killed_counted_and_the_others_still_report(tmp_path):
    (tmp_path / "slow.json").write_text(json.dumps(SLOW))
    report_path = tmp_path / "report.json"
    args = (
        f"fuzz --target xgrammar,corral --corpus {tmp_path / 'slow.json'} --budget 1 --jobs 1 "
        f"--timeout 1 --walks 1 --draws 0 --mutations 0 --out {tmp_path / 'found'} "
        f"--json {report_path} --fail-on hang --no-progress"
    )
    rc = corral_main(shlex.split(args))
    assert rc == 1
    report = json.loads(report_path.read_text())
    assert report["targets"]["xgrammar"]["status"] == {"hang": 1}
    # The case was rerun on a fresh worker without the hung target.
    assert report["targets"]["corral"]["status"] == {"ok": 1}
    assert report["targets"]["corral"]["walks"]
    hangs = [f for f in report["failures"] if f["kind"] == "hang"]
    assert hangs and hangs[0]["target"] == "xgrammar" and "compile" in hangs[0]["detail"]
    (saved_path,) = (tmp_path / "found" / "xgrammar").glob("hang--*slow.json")
    saved = json.loads(saved_path.read_text())
    assert saved["schema"] == SLOW
