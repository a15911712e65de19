"""Outputs are safe and failures are told apart: bad input exits 2, an internal failure exits 1 and
says it is a bug, a corrupt cache is neither; a report replaces an earlier one whole."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadencerl.cli import app
from cadencerl.config import builtin_scenario
from cadencerl.report.build import OutputError, _replace_dir, check_out_dir
from cadencerl.runs import sweep as sw
from cadencerl.runs.outputs import fresh_dir, write_atomic
from tests.conftest import ran_in_plain_python

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()


def one_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    return lines[0]


def test_an_internal_failure_exits_1_and_says_it_is_a_bug(monkeypatch):
    import cadencerl.runs.simulate as simulate_module

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(simulate_module, "simulate", broken)
    r = runner.invoke(app, ["sim", "-s", "h800-16", "-p", "least-loaded", "--trajectories", "16"])
    assert r.exit_code == 1
    line = one_line(r.output)
    assert "bug" in line and "KeyError" in line and "Traceback" not in r.output


def test_a_failed_conservation_check_is_a_bug_not_bad_input(monkeypatch, request):
    from cadencerl.core.controller import Controller

    if ran_in_plain_python(request):        # it patches the controller's method
        return
    monkeypatch.setattr(Controller, "check_conservation", lambda self: ["trajectory 3 finished twice"])
    r = runner.invoke(app, ["sim", "-s", "h800-16", "-p", "least-loaded", "--trajectories", "16"])
    assert r.exit_code == 1 and "conservation" in one_line(r.output)


def test_a_corrupt_sweep_cache_is_not_bad_input(tmp_path):
    scenario = builtin_scenario("h800-16").resized(32)
    path = sw.cache_path(scenario, sw.QUICK_GRID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"best": ')
    target = tmp_path / "r.json"
    r = runner.invoke(app, ["sim", "-s", "h800-16", "--trajectories", "32", "-p", "cache-aware-tuned",
                            "--json", str(target)])
    assert r.exit_code == 0, r.output
    assert json.loads(target.read_text())["trajectories_completed"] == 32
    assert set(json.loads(path.read_text())["best"]) == {*sw.QUICK_GRID, "version_switch"}


def test_json_is_written_whole(tmp_path):
    target = tmp_path / "deep" / "r.json"
    r = runner.invoke(app, ["sim", "-s", "h800-16", "-p", "least-loaded", "--trajectories", "16",
                            "--json", str(target)])
    assert r.exit_code == 0, r.output
    assert json.loads(target.read_text())["trajectories_completed"] == 16
    assert [p.name for p in target.parent.iterdir()] == ["r.json"]   # no temporary file left


def test_a_new_report_replaces_the_old_one_whole(tmp_path):
    out = tmp_path / "report"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "stale.png").write_bytes(b"old")
    (out / "report.md").write_text("old")
    (out / "results.json").write_text("{}")
    check_out_dir(out)                                   # an earlier report may be replaced
    staging = tmp_path / ".staging"
    (staging / "figures").mkdir(parents=True)
    (staging / "figures" / "new.png").write_bytes(b"new")
    (staging / "report.md").write_text("new")
    _replace_dir(staging, out)
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["new.png"]
    assert (out / "report.md").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_out_that_is_not_a_report_is_refused(tmp_path):
    (tmp_path / "thesis.tex").write_text("x")
    with pytest.raises(OutputError, match="thesis.tex"):
        check_out_dir(tmp_path)


def test_a_folder_that_only_looks_like_a_report_is_refused(tmp_path):
    """A project folder with its own figures/ or scenarios/ is not an earlier report: replaced
    whole, the user's files in it would be lost."""
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "thesis-plot.png").write_bytes(b"mine")
    with pytest.raises(OutputError, match="no report.md"):
        check_out_dir(tmp_path)
    (tmp_path / "report.md").write_text("old")
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="scenarios/notes.txt"):
        check_out_dir(tmp_path)


def test_out_that_holds_the_current_directory_is_refused(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    for out in (Path("."), tmp_path):
        with pytest.raises(OutputError, match="holds the current directory"):
            check_out_dir(out)


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_json_gets_the_umask_mode_and_keeps_a_chosen_one(tmp_path, umask):
    """Not 0o600 whatever the umask (tempfile's mode); a re-run keeps a mode the user set."""
    target = tmp_path / "r.json"
    args = ["sim", "-s", "h800-16", "-p", "least-loaded", "--trajectories", "16", "--json", str(target)]
    assert runner.invoke(app, args).exit_code == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    target.chmod(0o604)
    assert runner.invoke(app, args).exit_code == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o604


def test_fresh_dir_gets_the_umask_mode(tmp_path, umask):
    made = fresh_dir(tmp_path, ".staging-")
    assert made.parent == tmp_path and not any(made.iterdir())
    assert stat.S_IMODE(made.stat().st_mode) == 0o777 & ~umask


def test_json_to_a_device_or_through_a_link_writes_there_and_replaces_neither(tmp_path):
    """`--json /dev/null` once replaced /dev/null with a regular file (write_atomic renamed over it)."""
    fifo, target, link = tmp_path / "fifo", tmp_path / "target.json", tmp_path / "link.json"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_atomic(fifo, "{}\n")
    reader.join(10)
    assert got == ["{}\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    target.write_text("old")
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
