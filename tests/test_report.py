"""`cadencerl report` on a tiny workload: files, tables, figures, reproduction commands, bad input."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app
from cadencerl.config import load_scenario_file
from cadencerl.report.matrix import (ABLATION_POLICIES, GROUPED_BASELINES, HETEROGENEOUS_POOLS, MIXED_POLICIES,
                                    STEADY_ITERATIONS, make_settings, planned_runs)
from cadencerl.runs.reference import REFERENCE

runner = CliRunner()
TINY = 128  # trajectories per run: the whole matrix in a few seconds


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    r = runner.invoke(app, ["report", "--quick", "--trajectories", str(TINY), "--jobs", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "report written to" in r.output
    assert "CadenceRL vs the best baseline" in r.output and "16a16b8h" in r.output  # the headline, in the terminal
    return out


def test_files_written(report_dir):
    assert (report_dir / "report.md").is_file()
    assert (report_dir / "results.json").is_file()
    assert list((report_dir / "figures").glob("*.png"))


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_report_gets_the_umask_modes(report_dir):
    """The directory and its files as any program would make them, not tempfile's 0o700."""
    mask = current_umask()
    assert stat.S_IMODE(report_dir.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((report_dir / "results.json").stat().st_mode) == 0o666 & ~mask


def test_every_section_and_table(report_dir):
    text = (report_dir / "report.md").read_text()
    for n in range(1, 12):
        assert re.search(rf"^## {n}\. ", text, re.M), f"section {n} missing"
    assert "## Headline" in text and "### Derivation" in text
    assert "| policy | throughput tok/s |" in text
    for pool in HETEROGENEOUS_POOLS:
        assert re.search(rf"^\| {pool} \| [\d,]+ \|", text, re.M), f"no ratio row for {pool}"
    assert "MISA-T" in text
    assert "*Setup:*" in text and f"{TINY} trajectories" in text
    assert "steady window" in text and "cadence-no-pacing" in text and "laminar-grouped" in text


def test_every_referenced_image_exists_and_has_a_caption(report_dir):
    text = (report_dir / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) >= 9
    for rel in images:
        path = report_dir / rel
        assert path.is_file(), rel
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, rel
    captions = re.findall(r"^\*Figure \d+[ab]?\. ", text, re.M)
    assert len(captions) == len(images)


def test_results_json_has_every_run(report_dir):
    data = json.loads((report_dir / "results.json").read_text())
    mixed = [r for r in data["runs"] if r["scenario"].startswith("mixed-")]
    runs = [r for r in data["runs"] if not r["scenario"].startswith("mixed-")]
    assert len(runs) == len(planned_runs(make_settings(True, TINY))) + 2  # + the two traced runs
    assert {r["policy"] for r in runs} == {"cadence", "sync", "one-off", "dora", "laminar", "areal", "least-loaded",
                                           *ABLATION_POLICIES, *GROUPED_BASELINES, REFERENCE}
    assert {r["policy"] for r in mixed} == set(MIXED_POLICIES)  # section 10: MISA-T against the routers
    assert not [r for r in runs if r["policy"] == "dora" and r["scenario"] in HETEROGENEOUS_POOLS]
    for r in runs:
        assert r["trajectories_completed"] == TINY == r["setup"]["trajectories"]
        assert {"throughput_tok_s", "latency_p95_s", "bound_throughput_tok_s", "context_timeline",
                "steady_throughput_tok_s", "latency_from_submit_p95_s"} <= set(r)
        assert r["steady_iterations"] == STEADY_ITERATIONS - 2
    assert sum("traces" in r for r in runs) == 2


def test_reproduction_command_gives_the_same_row(report_dir):
    text = (report_dir / "report.md").read_text()
    configs = set(re.findall(r"--config (\S+\.yaml)", text))
    assert configs
    for c in configs:
        load_scenario_file(c)
    cmd = next(c for c in re.findall(r"`(cadencerl compare [^`]+)`", text)
               if "-s 16a16b8h " in c or "/16a16b8h.yaml" in c)
    args = shlex.split(cmd)[1:]
    args[args.index("--policies") + 1] = "cadence"
    target = report_dir / "again.json"
    r = runner.invoke(app, [*args, "--json", str(target)])
    assert r.exit_code == 0, r.output
    (again,) = json.loads(target.read_text())
    recorded = next(x for x in json.loads((report_dir / "results.json").read_text())["runs"]
                    if x["scenario"] == "16a16b8h" and x["policy"] == "cadence" and "traces" not in x
                    and x["setup"]["eta"] == 1 and x["setup"]["delta"] == 1024)
    assert again["throughput_tok_s"] == pytest.approx(recorded["throughput_tok_s"])
    assert again["latency_p95_s"] == pytest.approx(recorded["latency_p95_s"])


@pytest.mark.parametrize("args, field", [
    ([], "out"),
    (["--trajectories", "3"], "trajectories"),
    (["--jobs", "0"], "jobs"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, field):
    out = [] if field == "out" else ["--out", str(tmp_path / "r")]
    r = runner.invoke(app, ["report", *out, *args])
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and field in r.output


def test_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = runner.invoke(app, ["report", "--out", str(f)])
    assert r.exit_code == 2 and "not a directory" in r.output


def test_every_run_lasts_sixteen_iterations():
    quick, full, sized = make_settings(quick=True), make_settings(), make_settings(trajectories=1600)
    assert full.trajectories == 16 * 4096 and full.batch_size is None  # the scenarios' own batch
    assert quick.trajectories == 16 * quick.batch_size
    assert sized.trajectories == 16 * sized.batch_size == 1600
    assert len(quick.etas) < len(full.etas) and len(quick.deltas) < len(full.deltas)
    assert len(quick.ablation_pools) == 1 and set(full.ablation_pools) == set(HETEROGENEOUS_POOLS)
