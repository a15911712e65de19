"""Section 12 renders the simulator-change benchmark's JSON: revisions, commands, table, what moved."""

import json
from importlib import import_module
from pathlib import Path

import pytest

from cadencerl.report.sections import EXPERIMENTS

pytestmark = pytest.mark.timeout(30)
section = import_module("cadencerl.report.sections.simulator_change")   # the module (the package exports its function)
FIXTURE = Path(__file__).parent / "fixtures" / "simulator_change.json"


def test_renders_the_table_revisions_and_commands():
    text = section.render(json.loads(FIXTURE.read_text()))
    assert text.startswith("## 12. ")
    assert "`1111111111` (before the change)" in text and "`2222222222` (after the change)" in text
    assert "`cadencerl compare -s 16a8h --policies cadence,laminar --trajectories 512`" in text
    assert "`python benchmarks/simulator_change.py --trajectories 512`" in text
    assert "| laminar | 10,000 | 11,000 | +10.0% | 200.0 | 180.0 | -10.0% |" in text
    assert "| cadence | 20,000 | 20,100 | +0.5% | 100.0 | 100.0 | +0.0% |" in text
    assert "| **bound** | 40,000 | 38,000 | -5.0% | 50.0 | 50.0 | +0.0% |" in text


def test_says_what_moved_and_what_did_not():
    text = section.render(json.loads(FIXTURE.read_text()))
    moved = next(line for line in text.splitlines() if line.startswith("- **Moved"))
    within = next(line for line in text.splitlines() if line.startswith("- **Within"))
    assert "laminar throughput +10.0% (10,000 -> 11,000 tok/s)" in moved and "laminar P95 -10.0%" in moved
    assert "cadence" not in moved
    assert "cadence throughput +0.5% (20,000 -> 20,100 tok/s)" in within
    assert "the throughput bound -5.0% (40,000 -> 38,000 tok/s)" in text
    assert "`cadencerl/policies/laminar.py`" in text   # a policy that changed too is named


def test_a_checkout_without_the_results_says_how_to_make_them(monkeypatch, tmp_path):
    monkeypatch.setattr(section, "RESULTS", tmp_path / "missing.json")
    assert "python benchmarks/simulator_change.py" in section.simulator_change(None)


def test_it_is_in_the_report():
    assert EXPERIMENTS[-1] is section.simulator_change


def test_the_simulator_change_alone_is_one_more_line():
    data = json.loads(FIXTURE.read_text())
    iso = json.loads(FIXTURE.read_text())
    iso["new"]["results"]["laminar"]["throughput_tok_s"] = 10500.0
    iso["command"] = "python benchmarks/simulator_change.py --new 2222222"
    text = section.render(data, iso)
    line = next(x for x in text.splitlines() if x.startswith("- **The simulator change alone**"))
    assert "laminar +5.0% (10,000 -> 10,500)" in line and "cadence +0.5% (20,000 -> 20,100)" in line
    assert "--new 2222222" in line
    assert text.count("| laminar |") == 1   # still one table
