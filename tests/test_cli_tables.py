"""The results tables keep names, headers and figures whole, piped or on a narrow terminal."""

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app

runner = CliRunner()
LONG_NAMES = ("cadence-no-pacing", "cadence-no-affinity", "cadence-no-kv-prep")


def compare_output(columns: str | None) -> str:
    result = runner.invoke(app, ["compare", "-s", "cpu-pair", "--policies", ",".join(LONG_NAMES),
                                 "--trajectories", "32"], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    return result.output


def test_piped_table_is_not_squeezed():
    """Not a terminal and no $COLUMNS: every row names its policy, headers on one line."""
    out = compare_output(None)
    for name in LONG_NAMES:
        assert f"│ {name} " in out
    assert "…" not in out
    assert "throughput tok/s" in out and "steady P95 from submit s" in out


@pytest.mark.parametrize("columns", ["100", "40"])
def test_narrow_console_cuts_no_name_or_figure(columns):
    """A narrow console wraps headers at spaces but cuts nothing and drops no column."""
    out = compare_output(columns)
    for name in LONG_NAMES:
        assert f"│ {name} " in out
    assert "…" not in out
    assert "throughput" in out and "preempt" in out and "wall" in out


def test_a_lost_workers_reason_keeps_its_url():
    """Engine errors end with '[URL]', which the caption took for rich markup and dropped: the run
    printed 'worker 1 lost: ... after 12 tokens )' with the server's URL gone."""
    from rich.console import Console

    from cadencerl.cli.tables import engine_table

    why = "its /health refused the connection after a stream broke (peer closed [http://127.0.0.1:28798/generate])"
    result = {"policy": "cadence", "workers": [], "makespan_wall_s": 1.0, "setup_wall_s": 0.1, "resumes": 0,
              "resumes_accepted": 0, "aborts": 0, "lost_workers": [1], "lost_why": {"1": why}}
    out = Console(width=400, record=True)
    out.print(engine_table(result))
    assert f"worker 1 lost: {why}" in " ".join(out.export_text().split())   # the caption wraps to the table


def test_a_mixed_workload_shows_what_the_trainer_got_against_its_target():
    """Prefix hits and the mix distance were only in --json: a batch with a class missing went unseen."""
    mixed = runner.invoke(app, ["compare", "-s", "mixed-h200", "--trajectories", "128", "--policies",
                                "misa+cache-aware,cache-aware"])
    assert mixed.exit_code == 0, mixed.output
    assert "prefix hits" in mixed.output and "mix D_TV pp (steady)" in mixed.output
    plain = compare_output(None)
    assert "mix D_TV" not in plain           # one class: nothing to compare against
