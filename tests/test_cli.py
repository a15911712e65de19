"""Bad input gets one line naming the field, exit code 2, and no traceback."""

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app

runner = CliRunner()

GOOD = textwrap.dedent("""\
    name: mine
    model: Qwen3-8B
    pool:
      - {accelerator: H800, devices: 2, tp: 1}
    workload:
      trajectories: 16
      group_size: 4
      response: {median: 200, sigma: 0.5, cap: 1000}
    trainer:
      batch_size: 8
      train_time_s: 1
    """)


def run(*args):
    return runner.invoke(app, list(args))


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_sim_json_to_stdout_is_only_json():
    r = subprocess.run([sys.executable, "-m", "cadencerl.cli", "sim", "-s", "h800-16", "-p", "least-loaded",
                        "--trajectories", "64", "--json", "-"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["trajectories_completed"] == 64 and data["policy"] == "least-loaded"
    assert "throughput" in r.stderr  # the table went to stderr


def test_user_config_file_runs(tmp_path):
    r = run("sim", "--config", write(tmp_path, GOOD), "-p", "least-loaded")
    assert r.exit_code == 0, r.output
    assert "mine" in r.output


@pytest.mark.parametrize("mutate, field", [
    (lambda t: t.replace("H800", "H9000"), "pool.0.accelerator"),
    (lambda t: t.replace("Qwen3-8B", "Llama-9"), "model"),
    (lambda t: t.replace("devices: 2", "devices: -2"), "pool.0.devices"),
    (lambda t: t.replace("  trajectories: 16\n", ""), "workload.trajectories"),
    (lambda t: t.replace("H800, devices: 2, tp: 1", "BI-V150, devices: 2, tp: 2").replace("Qwen3-8B", "Qwen3-32B"),
     "pool.0"),
    (lambda t: t.replace("batch_size: 8", "batch_size: lots"), "trainer.batch_size"),
    (lambda t: t + "bogus: 1\n", "bogus"),
    (lambda t: t + "  : [\n", "not valid YAML"),
    (lambda t: t + "cadence:\n  spread: {home: tie-brake}\n", "cadence.spread.home"),
])
def test_bad_config_names_the_field(tmp_path, mutate, field):
    r = run("sim", "--config", write(tmp_path, mutate(GOOD)), "-p", "least-loaded")
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0], r.output
    assert "Traceback" not in r.output


def test_model_that_does_not_fit_says_so(tmp_path):
    bad = GOOD.replace("H800, devices: 2, tp: 1", "BI-V150, devices: 2, tp: 2").replace("Qwen3-8B", "Qwen3-32B")
    r = run("sim", "--config", write(tmp_path, bad), "-p", "least-loaded")
    assert r.exit_code == 2 and "does not fit" in r.output


def test_malformed_trace_line_names_the_line(tmp_path):
    trace = write(tmp_path, '{"prompt_len": 5, "response_len": 9}\n{"prompt_len": 5}\n', "t.jsonl")
    cfg = GOOD.replace("  group_size: 4\n", "").replace("  response: {median: 200, sigma: 0.5, cap: 1000}\n",
                                                         f"  trace: {trace}\n")
    r = run("sim", "--config", write(tmp_path, cfg), "-p", "least-loaded")
    assert r.exit_code == 2
    assert "line 2" in r.output and "response_len" in r.output


@pytest.mark.parametrize("args, text", [
    (["sim", "-s", "nowhere"], "unknown scenario"),
    (["sim", "-s", "h800-16", "-p", "magic"], "unknown policy"),
    (["sim"], "--scenario"),
    (["sim", "--config", "/no/such/file.yaml"], "no such file"),
    (["compare", "-s", "h800-16", "--policies", ","], "at least one policy"),
    (["compare", "-s", "mixed-h200", "--trainer-cluster", "elsewhere"], "trainer.cluster: 'elsewhere'"),
])
def test_bad_cli_arguments(args, text):
    r = run(*args)
    assert r.exit_code == 2 and text in r.output and "Traceback" not in r.output


def test_negative_option_is_rejected():
    r = run("sim", "-s", "h800-16", "--seed", "-3")
    assert r.exit_code == 2 and "--seed" in r.output


def test_scenarios_lists_the_builtins():
    r = run("scenarios")
    assert r.exit_code == 0
    for name in ("h800-16", "32a", "32b", "16a16b", "16a8h", "16b8h", "16a16b8h"):
        assert name in r.output


def test_every_builtin_scenario_builds_its_pool():
    from cadencerl.config import builtin_names, builtin_scenario
    from cadencerl.runs.assemble import build_pool

    for name in builtin_names():
        workers, _ = build_pool(builtin_scenario(name))
        assert workers, name


def test_compare_shows_distance_from_bound_and_reference(tmp_path):
    """Every run's row has '% bound'; with --reference also '% ref', and the JSON carries both fractions."""
    out = tmp_path / "r.json"
    r = run("compare", "-s", "16a8h", "--policies", "cadence,least-loaded", "--trajectories", "48", "--reference",
            "--json", str(out))
    assert r.exit_code == 0, r.output
    runs = json.loads(out.read_text())
    for x in runs:
        assert 0 < x["throughput_fraction_of_bound"] <= 1
        assert x["throughput_fraction_of_reference"] == pytest.approx(
            x["throughput_tok_s"] / x["reference_throughput_tok_s"])
        assert f"{100 * x['throughput_fraction_of_reference']:.0f}%" in r.output
    assert "clairvoyant reference" in r.output and "% bound" in r.output


def test_sim_says_how_to_get_the_reference_when_it_is_off(tmp_path):
    out = tmp_path / "r.json"
    r = run("sim", "-s", "16a8h", "-p", "least-loaded", "--trajectories", "48", "--json", str(out))
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert "throughput_fraction_of_reference" not in data
    assert f"{100 * data['throughput_fraction_of_bound']:.0f}%" in r.output
    assert "--reference" in " ".join(r.output.split())


def test_sensitivity_cells_show_p95_from_admission_and_from_submission():
    from cadencerl.cli.tables import sensitivity_table

    def cells(runs):
        table = sensitivity_table("t", runs, [1], [512, 4096])
        return [list(c.cells)[0] for c in table.columns[1:]]

    whole = [dict(eta=1, delta=d, throughput_tok_s=1000.0 * d, latency_p95_s=10.0 + d, latency_from_submit_p95_s=20.0 + d,
                  steady_window_s=None) for d in (512, 4096)]
    assert cells(whole) == ["512,000 / 522 / 532", "4,096,000 / 4106 / 4116"]
    # with a steady window in every run, the cells are the steady window's figures
    steady = [dict(r, steady_window_s=[1.0, 2.0], steady_throughput_tok_s=7.0, steady_latency_p95_s=8.0,
                   steady_latency_from_submit_p95_s=9.0) for r in whole]
    assert cells(steady) == ["7 / 8 / 9", "7 / 8 / 9"]


def test_ctrl_c_says_interrupted_and_exits_130(monkeypatch, tmp_path):
    """Ctrl-C in a command (here `pool down`) ends it with 'interrupted', not silently: typer turns
    KeyboardInterrupt into a bare exit 130, which left main()'s own message unreachable."""
    from cadencerl.devpool import local_pool

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(local_pool, "down", interrupted)
    result = CliRunner().invoke(app, ["pool", "down", "--state-dir", str(tmp_path)])
    assert result.exit_code == 130 and result.output.strip() == "interrupted", result.output


def test_a_built_in_scenarios_file_is_printed_to_start_ones_own(tmp_path):
    """`scenarios NAME` prints the file as written; saved, it is the same scenario."""
    r = run("scenarios", "mixed-h200")
    assert r.exit_code == 0, r.output
    path = write(tmp_path, r.output, "mine.yaml")
    from cadencerl.config import builtin_scenario, load_scenario_file
    assert load_scenario_file(path) == builtin_scenario("mixed-h200")
    bad = run("scenarios", "nope")
    assert bad.exit_code == 2 and "unknown scenario 'nope'" in bad.output
