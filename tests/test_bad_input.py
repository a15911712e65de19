"""Bad input, table-driven: every case exits 2 (or raises ConfigError from the Python API) with one
line that names the field, no traceback, within a bound on wall time. Then the valid edge cases
(CRLF, BOM, unicode names, TOML, a trace beside its scenario) that must run.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadencerl.cli import app
from cadencerl.cli.common import build_scenario
from cadencerl.config import ConfigError, builtin_scenario, load_scenario_dict, load_scenario_file
from cadencerl.workload.trace import load_trace
from tests.test_cli import GOOD as CLI_GOOD

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()
WALL_BOUND_S = 30.0  # generous for a busy 2-core machine; a refusal itself takes milliseconds

GOOD = CLI_GOOD + "controller:\n  tick_s: 0.5\ncadence:\n  delta: 1024\n"

MIXED = GOOD.replace("  group_size: 4\n", "").replace("  response: {median: 200, sigma: 0.5, cap: 1000}\n", """\
  classes:
    a: {share: 1, response: {median: 200, cap: 1000}}
    b: {share: 2, response: {median: 100, cap: 1000}}
""")

MULTI_TURN = GOOD.replace("  group_size: 4\n", "  group_size: 4\n  turns: {turns_min: 1, turns_max: 3}\n")

TOML = """\
name = "mine"
model = "Qwen3-8B"
[[pool]]
accelerator = "H800"
devices = 2
[workload]
trajectories = 16
response = {median = 200, cap = 1000}
[trainer]
batch_size = 8
"""

GOOD_TRACE_LINE = '{"prompt_len": 10, "response_len": 50, "group": 0}'


def sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# (id, scenario text, the field the one line must name)
YAML_CASES = [
    ("shape-beside-classes", sub(MIXED, "  classes:\n", "  response: {median: 50, cap: 100}\n  classes:\n"),
     "workload.response: not used here"),
    ("group-beside-classes", sub(MIXED, "  classes:\n", "  group_size: 4\n  classes:\n"), "workload.group_size"),
    ("shape-beside-trace", sub(GOOD, "  response: {median: 200, sigma: 0.5, cap: 1000}\n", "  trace: t.jsonl\n"),
     "workload.group_size: not used here"),
    ("class-shape-beside-trace", sub(sub(GOOD, "  group_size: 4\n", ""), "  response: {median: 200, sigma: 0.5, cap: 1000}\n",
                                     "  trace: t.jsonl\n  classes: {a: {share: 1, turns: {turns_max: 3}}}\n"),
     "workload.classes.a.turns: not used here"),
    ("misspelt-key", sub(GOOD, "{accelerator: H800,", "{accelerater: H800,"), "pool.0.accelerater: unknown key"),
    ("misspelt-count", sub(GOOD, "trajectories: 16", "trajectorys: 16"), "workload.trajectorys: unknown key"),
    ("refused-value-shown", sub(GOOD, "train_time_s: 1", "train_time_s: one"), "got 'one'"),
    ("too-many-workers", sub(GOOD, "devices: 2, tp: 1", "devices: 8192, tp: 1"), "pool: 8,192 workers"),
    ("train-time-inf", sub(GOOD, "train_time_s: 1", "train_time_s: .inf"), "trainer.train_time_s"),
    ("train-time-nan", sub(GOOD, "train_time_s: 1", "train_time_s: .nan"), "trainer.train_time_s"),
    ("train-time-absurd", sub(GOOD, "train_time_s: 1", "train_time_s: 1e12"), "trainer.train_time_s"),
    ("train-time-negative", sub(GOOD, "train_time_s: 1", "train_time_s: -1"), "trainer.train_time_s"),
    ("per-token-time-negative", sub(GOOD, "train_time_s: 1", "train_time_per_token_s: -1"),
     "trainer.train_time_per_token_s"),
    ("tick-tiny", sub(GOOD, "tick_s: 0.5", "tick_s: 1e-300"), "controller.tick_s"),
    ("tick-zero", sub(GOOD, "tick_s: 0.5", "tick_s: 0"), "controller.tick_s"),
    ("tick-inf", sub(GOOD, "tick_s: 0.5", "tick_s: .inf"), "controller.tick_s"),
    ("headroom-one", sub(GOOD, "delta: 1024", "headroom_floor: 1"), "cadence.headroom_floor"),
    ("growth-ticks-absurd", sub(GOOD, "delta: 1024", "growth_ticks: 30000"), "cadence.growth_ticks"),
    ("eta-absurd", sub(GOOD, "tick_s: 0.5", "eta: 100000"), "controller.eta"),
    ("delta-absurd", sub(GOOD, "delta: 1024", "delta: 100000000000"), "cadence.delta"),
    ("kv-preparation-string", sub(GOOD, "delta: 1024", "kv_preparation: 'maybe'"), "cadence.kv_preparation"),
    ("share-overflow", sub(MIXED, "share: 1,", "share: 1e308,"), "workload.classes.a.share"),
    ("share-inf", sub(MIXED, "share: 1,", "share: .inf,"), "workload.classes.a.share"),
    ("share-zero", sub(MIXED, "share: 1,", "share: 0,"), "workload.classes.a.share"),
    ("class-without-response", sub(MIXED, "share: 1, response: {median: 200, cap: 1000}", "share: 1"),
     "classes.a.response"),
    ("classes-empty", sub(GOOD, "  response: {median: 200, sigma: 0.5, cap: 1000}\n", "  classes: {}\n"),
     "classes"),
    ("class-name-markup", sub(MIXED, "    a: {", "    '[red]a': {"), "workload.classes"),
    ("turns-min-above-max", sub(MULTI_TURN, "turns_min: 1, turns_max: 3", "turns_min: 4, turns_max: 3"),
     "workload.turns"),
    ("turns-max-absurd", sub(MULTI_TURN, "turns_max: 3", "turns_max: 1000000"), "workload.turns.turns_max"),
    ("tool-latency-inf", sub(MULTI_TURN, "turns_max: 3", "turns_max: 3, tool_latency_median_s: .inf"),
     "workload.turns.tool_latency_median_s"),
    ("tool-latency-nan", sub(MULTI_TURN, "turns_max: 3", "turns_max: 3, tool_latency_median_s: .nan"),
     "workload.turns.tool_latency_median_s"),
    ("name-markup", sub(GOOD, "name: mine", "name: '[bold red]mine[/]'"), "name"),
    ("name-path", sub(GOOD, "name: mine", "name: ../../escape"), "name"),
    ("name-dot", sub(GOOD, "name: mine", "name: .hidden"), "name"),
    ("name-newline", sub(GOOD, "name: mine", 'name: "a\\nb"'), "name"),
    ("name-empty", sub(GOOD, "name: mine", "name: ''"), "name"),
    ("name-number", sub(GOOD, "name: mine", "name: 2024"), "name"),
    ("cluster-path", sub(GOOD, "tp: 1}", "tp: 1, cluster: a/b}"), "pool.0.cluster"),
    ("affinity-not-in-pool", sub(GOOD, "workload:", "affinity_order: [H800, A910X]\nworkload:"), "affinity_order.1"),
    ("affinity-twice", sub(GOOD, "workload:", "affinity_order: [H800, H800]\nworkload:"), "affinity_order.1"),
    ("affinity-unknown", sub(GOOD, "workload:", "affinity_order: [H80]\nworkload:"), "affinity_order.0"),
    ("median-above-cap", sub(GOOD, "median: 200,", "median: 2000,"), "workload.response"),
    ("minimum-above-cap", sub(GOOD, "cap: 1000}", "cap: 1000, minimum: 5000}"), "workload.response"),
    ("cap-zero", sub(GOOD, "cap: 1000}", "cap: 0}"), "workload.response.cap"),
    ("sigma-absurd", sub(GOOD, "sigma: 0.5", "sigma: 1000"), "workload.response.sigma"),
    ("median-nan", sub(GOOD, "median: 200,", "median: .nan,"), "workload.response.median"),
    ("trajectories-true", sub(GOOD, "trajectories: 16", "trajectories: true"), "workload.trajectories"),
    ("trajectories-string", sub(GOOD, "trajectories: 16", "trajectories: '16'"), "workload.trajectories"),
    ("trajectories-float", sub(GOOD, "trajectories: 16", "trajectories: 16.5"), "workload.trajectories"),
    ("trajectories-absurd", sub(GOOD, "trajectories: 16", "trajectories: 1000000000000"), "workload.trajectories"),
    ("batch-above-trajectories", sub(GOOD, "batch_size: 8", "batch_size: 4096"), "trainer.batch_size"),
    ("group-size-zero", sub(GOOD, "group_size: 4", "group_size: 0"), "workload.group_size"),
    ("devices-string", sub(GOOD, "devices: 2", "devices: '2'"), "pool.0.devices"),
    ("devices-absurd", sub(GOOD, "devices: 2", "devices: 10000000"), "pool.0.devices"),
    ("max-num-seqs-zero", sub(GOOD, "tp: 1}", "tp: 1, max_num_seqs: 0}"), "pool.0.max_num_seqs"),
    ("seed-negative", sub(GOOD, "name: mine", "name: mine\nseed: -1"), "seed"),
    ("pool-empty", sub(GOOD, "  - {accelerator: H800, devices: 2, tp: 1}\n", "  []\n").replace("pool:\n  []", "pool: []"),
     "pool"),
    ("engine-unknown", GOOD + "engine: sglang\n", "engine"),
    ("unknown-nested-field", sub(GOOD, "  group_size: 4", "  group_size: 4\n  bogus: 1"), "workload.bogus"),
    ("description-huge", sub(GOOD, "name: mine", "name: mine\ndescription: '" + "x" * 3000 + "'"), "description"),
    ("response-null", sub(GOOD, "  response: {median: 200, sigma: 0.5, cap: 1000}", "  response: null"),
     "response"),
    ("duplicate-key", sub(GOOD, "  group_size: 4", "  group_size: 4\n  group_size: 8"), "line 8, column 3: duplicate key"),
    ("duplicate-top-key", GOOD + "name: other\n", "duplicate key 'name'"),
    ("yaml-syntax-line", sub(GOOD, "  group_size: 4", "  group_size: [4"), "line"),
    ("top-level-list", "- 1\n- 2\n", "mapping"),
    ("empty-file", "", "mapping"),
    ("deep-nesting", "a: " + "[" * 100_000 + "]" * 100_000 + "\n", "config"),
    ("trace-missing", sub(GOOD, "  group_size: 4", "  trace: nowhere.jsonl"), "workload.trace"),
    ("trace-empty-path", sub(GOOD, "  group_size: 4", "  trace: ''"), "workload.trace"),
]


def _run_config(tmp_path: Path, text: str | bytes, suffix: str = ".yaml", args: tuple[str, ...] = ()):
    path = tmp_path / f"scenario{suffix}"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return _invoke(["sim", "--config", str(path), "-p", "least-loaded", *args])


def _invoke(args: list[str]):
    started = time.monotonic()
    result = runner.invoke(app, args)
    return result, time.monotonic() - started


def assert_refused(result, wall: float, field: str) -> None:
    """Exit 2, one line naming the field, no traceback, promptly."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    assert field in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert wall < WALL_BOUND_S


@pytest.mark.parametrize("text, field", [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_bad_scenario_file(tmp_path, text, field):
    assert_refused(*_run_config(tmp_path, text), field)


TOML_CASES = [
    ("toml-syntax", TOML.replace("devices = 2", "devices = = 2"), "line 5"),
    ("toml-inf", TOML + "train_time_s = inf\n", "trainer.train_time_s"),
    ("toml-nan-share", TOML.replace("response = {median = 200, cap = 1000}",
                                    "classes = {a = {share = nan, response = {median = 200, cap = 1000}}}"),
     "workload.classes.a.share"),
    ("toml-bool-trajectories", TOML.replace("trajectories = 16", "trajectories = true"), "workload.trajectories"),
]


@pytest.mark.parametrize("text, field", [c[1:] for c in TOML_CASES], ids=[c[0] for c in TOML_CASES])
def test_bad_toml_file(tmp_path, text, field):
    assert_refused(*_run_config(tmp_path, text, ".toml"), field)


def test_non_utf8_scenario(tmp_path):
    assert_refused(*_run_config(tmp_path, GOOD.encode().replace(b"mine", b"m\xffne")), "config")


def test_oversized_scenario(tmp_path):
    assert_refused(*_run_config(tmp_path, GOOD + "#" * (2 << 20) + "\n"), "config")


def test_directory_as_config(tmp_path):
    result, wall = _invoke(["sim", "--config", str(tmp_path), "-p", "least-loaded"])
    assert_refused(result, wall, "directory")


def test_trace_that_is_a_directory(tmp_path):
    (tmp_path / "t.jsonl").mkdir()
    assert_refused(*_run_config(tmp_path, sub(GOOD, "  group_size: 4", "  trace: t.jsonl")), "workload.trace")


# (id, trace lines, the field the one line must name); every trace holds 16 records when valid
TRACE_CASES = [
    ("tool-latency-infinity", '{"prompt_len": 10, "response_len": 5, "turns": [{"observation_len": 3, '
     '"tool_latency_s": Infinity, "response_len": 4}]}', "turns.0.tool_latency_s"),
    ("tool-latency-nan", '{"prompt_len": 10, "response_len": 5, "turns": [{"observation_len": 3, '
     '"tool_latency_s": NaN, "response_len": 4}]}', "turns.0.tool_latency_s"),
    ("tool-latency-negative", '{"prompt_len": 10, "response_len": 5, "turns": [{"observation_len": 3, '
     '"tool_latency_s": -1, "response_len": 4}]}', "turns.0.tool_latency_s"),
    ("tool-latency-absurd", '{"prompt_len": 10, "response_len": 5, "turns": [{"observation_len": 3, '
     '"tool_latency_s": 1e300, "response_len": 4}]}', "turns.0.tool_latency_s"),
    ("turns-null", '{"prompt_len": 10, "response_len": 5, "turns": null}', "turns"),
    ("turn-not-object", '{"prompt_len": 10, "response_len": 5, "turns": [3]}', "turns.0"),
    ("unknown-field", '{"prompt_len": 10, "response_len": 5, "respones_len": 5}', "respones_len"),
    ("unknown-turn-field", '{"prompt_len": 10, "response_len": 5, "turns": [{"observation_len": 3, '
     '"response_len": 4, "latency": 1}]}', "turns.0.latency"),
    ("class-outside-mix", '{"prompt_len": 10, "response_len": 5, "class": "agentic"}', "class 'agentic'"),
    ("prompt-string", '{"prompt_len": "10", "response_len": 5}', "prompt_len"),
    ("prompt-bool", '{"prompt_len": true, "response_len": 5}', "prompt_len"),
    ("prompt-float", '{"prompt_len": 1.5, "response_len": 5}', "prompt_len"),
    ("response-zero", '{"prompt_len": 10, "response_len": 0}', "response_len"),
    ("response-absurd", '{"prompt_len": 10, "response_len": 1000000000000000000000000000000}', "response_len"),
    ("response-nan", '{"prompt_len": 10, "response_len": NaN}', "response_len"),
    ("group-negative", '{"prompt_len": 10, "response_len": 5, "group": -1}', "group"),
    ("line-is-list", "[1, 2]", "expected an object"),
    ("not-json", "{not json", "not JSON"),
    ("deep-json", "[" * 100_000 + "]" * 100_000, "line 2"),
]


def _trace_scenario(tmp_path: Path, lines: bytes, trajectories: int = 16) -> str:
    (tmp_path / "t.jsonl").write_bytes(lines)
    text = sub(GOOD, "  group_size: 4\n  response: {median: 200, sigma: 0.5, cap: 1000}\n", "  trace: t.jsonl\n")
    return sub(text, "trajectories: 16", f"trajectories: {trajectories}")


@pytest.mark.parametrize("line, field", [c[1:] for c in TRACE_CASES], ids=[c[0] for c in TRACE_CASES])
def test_bad_trace_line(tmp_path, line, field):
    body = "\n".join([GOOD_TRACE_LINE, line] + [GOOD_TRACE_LINE] * 14) + "\n"
    result, wall = _run_config(tmp_path, _trace_scenario(tmp_path, body.encode()))
    assert_refused(result, wall, field)
    assert "line 2" in result.output


@pytest.mark.parametrize("body, field", [
    (b"", "no trajectories"),
    (b"\n\n  \n", "no trajectories"),
    ((GOOD_TRACE_LINE + "\n").encode() * 3, "workload.trajectories"),       # fewer records than trajectories
    (GOOD_TRACE_LINE.encode() + b"\n\xff\xfe\n", "not UTF-8"),
], ids=["empty", "blank-lines", "too-short", "non-utf8"])
def test_bad_trace_file(tmp_path, body, field):
    assert_refused(*_run_config(tmp_path, _trace_scenario(tmp_path, body)), field)


CLI_CASES = [
    ("trajectories-zero", ["sim", "-s", "h800-16", "--trajectories", "0"], "--trajectories"),
    ("trajectories-absurd", ["sim", "-s", "h800-16", "--trajectories", "1000000000"], "workload.trajectories"),
    ("seed-negative", ["sim", "-s", "h800-16", "--seed", "-3"], "--seed"),
    ("eta-negative", ["sim", "-s", "h800-16", "--eta", "-1"], "--eta"),
    ("eta-absurd", ["sim", "-s", "h800-16", "--eta", "99999"], "controller.eta"),
    ("delta-not-int", ["sim", "-s", "h800-16", "--delta", "lots"], "--delta"),
    ("unknown-policy", ["sim", "-s", "h800-16", "-p", "magic"], "policy"),
    ("unknown-admission", ["sim", "-s", "h800-16", "-p", "magic+cadence"], "admission"),
    ("unknown-scenario", ["sim", "-s", "nowhere"], "scenario"),
    ("no-scenario", ["sim"], "--scenario"),
    ("both-scenario-and-config", ["sim", "-s", "h800-16", "--config", "x.yaml"], "--scenario"),
    ("empty-policies", ["compare", "-s", "h800-16", "--policies", ","], "policies"),
    ("bad-etas", ["sensitivity", "-s", "h800-16", "--etas", "a,b"], "etas"),
    ("bad-deltas", ["sensitivity", "-s", "h800-16", "--deltas", "-5"], "deltas"),
    ("bad-grid", ["sweep", "-s", "h800-16", "--grid", "huge"], "grid"),
    ("missing-config", ["sim", "--config", "/no/such/file.yaml"], "no such file"),
    ("report-jobs-zero", ["report", "--out", "unused-dir", "--jobs", "0"], "jobs"),
    ("report-few-trajectories", ["report", "--out", "unused-dir", "--trajectories", "3"], "trajectories"),
    ("report-out-is-a-file", ["report", "--out", __file__], "out"),
    ("report-jobs-absurd", ["report", "--out", "unused-dir", "--jobs", "100000"], "jobs"),
    ("config-is-a-device", ["sim", "--config", "/dev/null"], "not a regular file"),
    ("pool-up-too-many", ["pool", "up", "--workers", "100000"], "workers"),
    ("pool-up-request-as-long-as-the-kv", ["pool", "up", "--workers", "1", "--kv-tokens", "4096",
                                           "--max-model-len", "4096"], "max_model_len: 4096 needs at least 4128"),
    ("batch-size-zero", ["sim", "-s", "h800-16", "--batch-size", "0"], "--batch-size"),
    ("batch-size-above-trajectories", ["sim", "-s", "h800-16", "--trajectories", "64", "--batch-size", "65"],
     "trainer.batch_size"),
    ("json-unwritable", ["sim", "-s", "h800-16", "--json", "/proc/cadencerl/r.json"], "--json"),
    ("json-is-a-directory", ["sim", "-s", "h800-16", "--json", "/"], "--json"),
    ("unknown-command", ["simulate"], "No such command"),
    ("run-deadline-negative", ["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:9", "--deadline", "-1"],
     "deadline"),
    ("run-deadline-inf", ["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:9", "--deadline", "inf"],
     "deadline"),
    ("run-deadline-nan", ["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:9", "--deadline", "nan"],
     "deadline"),
    ("unknown-option", ["sim", "-s", "h800-16", "--trajectory", "5"], "--trajectory"),
    # an empty value is refused as such, not taken for 'not given' and failed on as a bug
    ("sim-empty-scenario", ["sim", "-s", ""], "error: scenario:"),
    ("compare-empty-scenario", ["compare", "-s", ""], "error: scenario:"),
    ("sweep-empty-scenario", ["sweep", "-s", ""], "error: scenario:"),
    ("sensitivity-empty-scenario", ["sensitivity", "-s", ""], "error: scenario:"),
    ("run-empty-scenario", ["run", "-s", "", "--workers", "http://127.0.0.1:9"], "error: scenario:"),
    ("pool-up-empty-scenario", ["pool", "up", "-s", ""], "error: scenario:"),
    ("run-empty-workers", ["run", "-s", "cpu-pair", "--workers", ""], "error: workers:"),
    ("run-blank-workers", ["run", "-s", "cpu-pair", "--workers", " , "], "error: workers:"),
    ("calibrate-empty-workers", ["calibrate", "--workers", ""], "error: workers:"),
    ("json-empty", ["sim", "-s", "h800-16", "--json", ""], "error: json: give a file path or '-'"),
    # a value given twice would run (or measure) twice, or silently be the default
    ("compare-duplicate-policy", ["compare", "-s", "h800-16", "--policies", "cadence,areal, cadence"],
     "error: policies: duplicate cadence"),
    ("sensitivity-duplicate-eta", ["sensitivity", "-s", "h800-16", "--etas", "1,1"], "error: etas: duplicate 1"),
    ("sensitivity-duplicate-delta", ["sensitivity", "-s", "h800-16", "--deltas", "512,1024,512"],
     "error: deltas: duplicate 512"),
    ("calibrate-duplicate-batch", ["calibrate", "--workers", "http://127.0.0.1:9", "--batches", "4,4"],
     "error: batches: duplicate 4"),
    # a port past 65535 passed the URL check and crashed in the socket layer, reported as a bug
    ("run-port-too-big", ["run", "-s", "cpu-pair", "--workers", "http://localhost:99999"], "error: workers:"),
    ("run-port-zero", ["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:9,http://127.0.0.1:0"],
     "error: workers:"),
    ("calibrate-port-too-big", ["calibrate", "--workers", "http://127.0.0.1:70000"], "error: workers:"),
    ("run-empty-labels", ["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:9", "--labels", ""],
     "error: labels:"),
]


@pytest.mark.parametrize("args, field", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_cli_option(args, field):
    assert_refused(*_invoke(args), field)


def test_json_may_not_overwrite_the_config(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text(GOOD)
    result, wall = _invoke(["sim", "--config", str(config), "--json", str(tmp_path / "." / "s.yaml")])
    assert_refused(result, wall, "--json")
    assert config.read_text() == GOOD


def test_markup_in_a_value_is_printed_as_given(tmp_path):
    result, wall = _run_config(tmp_path, sub(GOOD, "model: Qwen3-8B", "model: '[red]Qwen[/red]'"))
    assert_refused(result, wall, "model")
    assert "'[red]Qwen[/red]'" in result.output


def test_sweep_of_a_bad_trace_is_one_line(tmp_path):
    body = "\n".join([GOOD_TRACE_LINE, '{"prompt_len": 10, "response_len": 5, "class": "x"}'] * 8)
    config = tmp_path / "s.yaml"
    config.write_text(_trace_scenario(tmp_path, body.encode()))
    assert_refused(*_invoke(["sweep", "--config", str(config)]), "class 'x'")


def test_report_will_not_replace_a_directory_that_is_not_a_report(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert_refused(*_invoke(["report", "--out", str(tmp_path), "--trajectories", "16"]), "out")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _dict(**changes) -> dict:
    data = builtin_scenario("h800-16").model_dump()
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return data


API_CASES = [
    ("dict-tick-nan", lambda: load_scenario_dict(_dict(controller={"tick_s": float("nan")})), "controller.tick_s"),
    ("dict-bool-batch", lambda: load_scenario_dict(_dict(trainer={"batch_size": True})), "trainer.batch_size"),
    ("override-inf", lambda: builtin_scenario("h800-16").with_overrides(trainer={"train_time_s": float("inf")}),
     "trainer.train_time_s"),
    ("override-affinity", lambda: builtin_scenario("16a8h").with_overrides(affinity_order=["H800", "A910X", "A910X"]),
     "affinity_order.2"),
    ("resized-zero", lambda: builtin_scenario("h800-16").resized(0), "workload.trajectories"),
    ("resized-batch", lambda: builtin_scenario("h800-16").resized(64, batch_size=65), "trainer.batch_size"),
    ("load-file-directory", lambda: load_scenario_file(Path(".")), "directory"),
    ("load-trace-missing", lambda: load_trace("/no/such/trace.jsonl", object()), "workload.trace"),
    ("build-empty-scenario", lambda: build_scenario("", None, {}), "scenario"),
]


def _pool(**kwargs):
    from cadencerl.api import RolloutPool

    return RolloutPool(kwargs.pop("urls", [DEAD_URL]), **kwargs)


def test_a_pool_takes_a_batch_larger_than_its_scenario_s_placeholder_workload():
    """The workload is what is submitted; the default scenario's 96 trajectories are no bound, but
    a pool built from a scenario submits that scenario's workload, which bounds the batch."""
    from cadencerl.api import RolloutPool

    assert _pool(batch_size=128).scenario.trainer.batch_size == 128
    small_pair = builtin_scenario("cpu-pair").with_overrides(workload={"trajectories": 32}, trainer={"batch_size": 8})
    with pytest.raises(ConfigError, match="trainer.batch_size: 64 is more than workload.trajectories"):
        RolloutPool.from_scenario(small_pair, [DEAD_URL], batch_size=64)


def _submit(*args, **kwargs):
    pool = _pool()
    pool.submit(*args, **kwargs)


def _submit_after_close():
    pool = _pool()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit([1, 2], max_tokens=4)
    raise ConfigError("submit: raised RuntimeError as documented")


def _closed_port_url() -> str:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


DEAD_URL = _closed_port_url()
API_CASES += [
    ("pool-url-string", lambda: _pool(urls=DEAD_URL), "urls"),
    ("pool-url-not-http", lambda: _pool(urls=["ftp://x:1"]), "workers"),
    ("pool-url-number", lambda: _pool(urls=[8000]), "urls"),
    ("pool-url-port-too-big", lambda: _pool(urls=["http://127.0.0.1:65536"]), "workers"),
    ("pool-batch-true", lambda: _pool(batch_size=True), "trainer.batch_size"),
    ("pool-batch-string", lambda: _pool(batch_size="64"), "trainer.batch_size"),
    ("pool-deadline-beyond-a-week", lambda: _pool(deadline_s=1e12), "deadline_s"),
    ("pool-eta-float", lambda: _pool(eta=1.5), "controller.eta"),
    ("pool-kv-true", lambda: _pool(kv_tokens=True), "kv_tokens"),
    ("pool-kv-list-length", lambda: _pool(kv_tokens=[8192, 8192]), "kv_tokens"),
    ("pool-policy", lambda: _pool(policy="magic"), "policy"),
    ("pool-labels", lambda: _pool(labels=["H9000"]), "labels"),
    ("pool-labels-string", lambda: _pool(labels="H800"), "labels"),
    ("pool-deadline-negative", lambda: _pool(deadline_s=-1), "deadline_s"),
    ("pool-deadline-inf", lambda: _pool(deadline_s=float("inf")), "deadline_s"),
    ("pool-connect-timeout-nan", lambda: _pool(connect_timeout_s=float("nan")), "connect_timeout_s"),
    ("pool-join-timeout-zero", lambda: _pool(join_timeout_s=0), "join_timeout_s"),
    ("pool-timeouts-dict", lambda: _pool(timeouts={"connect": 1}), "timeouts"),
    ("pool-hook-not-callable", lambda: _pool(weight_update=3), "weight_update"),
    ("pool-scenario-dict", lambda: _pool(scenario={"name": "x"}), "scenario"),
    ("submit-string-prompt", lambda: _submit("123", max_tokens=4), "token_ids"),
    ("submit-empty", lambda: _submit([], max_tokens=4), "token_ids"),
    ("submit-float-ids", lambda: _submit([1.0, 2.0], max_tokens=4), "token_ids"),
    ("submit-bool-ids", lambda: _submit([True], max_tokens=4), "token_ids"),
    ("submit-negative-id", lambda: _submit([-1], max_tokens=4), "token_ids"),
    ("submit-max-tokens-true", lambda: _submit([1], max_tokens=True), "max_tokens"),
    ("submit-max-tokens-float", lambda: _submit([1], max_tokens=3.9), "max_tokens"),
    ("submit-max-tokens-string", lambda: _submit([1], max_tokens="4"), "max_tokens"),
    ("submit-max-tokens-huge", lambda: _submit([1], max_tokens=10**12), "max_tokens"),
    ("submit-group-negative", lambda: _submit([1], max_tokens=4, group=-2), "group"),
    ("submit-class-outside-mix", lambda: _submit([1], max_tokens=4, workload_class="agent"), "workload_class"),
    ("submit-after-close", _submit_after_close, "RuntimeError as documented"),
]


@pytest.mark.parametrize("call, field", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_bad_api_call(call, field):
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and field in message, message
    assert time.monotonic() - started < WALL_BOUND_S


def test_a_refused_connection_fails_at_once():
    """Nothing listens at the URL: the run fails in well under the 30 s connect timeout."""
    pool = _pool()
    pool.submit([1, 2, 3], max_tokens=4)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="refused"):
        list(pool.batches())
    assert time.monotonic() - started < 10
    pool.close()


# ------------------------------------------------------------------------------------------ valid edge cases


def _runs(result, wall: float) -> None:
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert wall < WALL_BOUND_S


@pytest.mark.parametrize("encode", [
    lambda t: t.replace("\n", "\r\n").encode(),
    lambda t: b"\xef\xbb\xbf" + t.encode(),
    lambda t: b"\xef\xbb\xbf" + t.replace("\n", "\r\n").encode(),
    lambda t: t.replace("name: mine", "name: 'démo π · 試験'").encode(),
], ids=["crlf", "bom", "bom-crlf", "unicode-name"])
def test_valid_yaml_variants_run(tmp_path, encode):
    result, wall = _run_config(tmp_path, encode(GOOD))
    _runs(result, wall)


@pytest.mark.parametrize("encode", [
    lambda t: t.encode(), lambda t: t.replace("\n", "\r\n").encode(), lambda t: b"\xef\xbb\xbf" + t.encode(),
], ids=["plain", "crlf", "bom"])
def test_valid_toml_variants_run(tmp_path, encode):
    _runs(*_run_config(tmp_path, encode(TOML), ".toml"))


@pytest.mark.parametrize("suffix", [".TOML", ".Toml"])
def test_a_toml_suffix_in_any_case_is_read_as_toml(tmp_path, suffix):
    _runs(*_run_config(tmp_path, TOML, suffix))


def test_trace_without_response_runs_everywhere(tmp_path, monkeypatch):
    """Item 1: the README's trace workload (no `response:`) runs through sim and compare, with
    `--trajectories` honoured; the relative trace path is resolved beside the scenario file."""
    lines = "\r\n".join(json.dumps({"prompt_len": 10 + i // 4, "response_len": 20 + 7 * i, "group": i // 4})
                        for i in range(16))
    config = tmp_path / "scenario.yaml"
    config.write_text(_trace_scenario(tmp_path, ("\ufeff" + lines + "\r\n").encode()))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result, wall = _invoke(["compare", "--config", str(config), "--policies", "cadence,misa+least-loaded",
                            "--json", "-"])
    _runs(result, wall)
    result, wall = _invoke(["sim", "--config", str(config), "-p", "least-loaded", "--trajectories", "12",
                            "--json", str(tmp_path / "r.json")])
    _runs(result, wall)
    figures = json.loads((tmp_path / "r.json").read_text())
    assert figures["trajectories_completed"] == 12 and figures["mixture_dtv_pp"] == 0.0


def test_trace_classes_inside_the_mix_run(tmp_path):
    lines = "\n".join(json.dumps({"prompt_len": 10, "response_len": 30, "class": "ab"[i % 2]}) for i in range(16))
    (tmp_path / "t.jsonl").write_text(lines)
    text = sub(GOOD, "  group_size: 4\n  response: {median: 200, sigma: 0.5, cap: 1000}\n",
               "  trace: t.jsonl\n  classes: {a: {share: 1}, b: {share: 1}}\n")
    result, wall = _run_config(tmp_path, text, args=("--json", "-"))
    _runs(result, wall)


def test_yaml_1_2_floats_are_numbers(tmp_path):
    """`1e-6` and `2e0` are numbers in YAML 1.2 (PyYAML's YAML 1.1 read them as strings, then refused them)."""
    path = tmp_path / "s.yaml"
    path.write_text(sub(GOOD, "train_time_s: 1", "train_time_s: 2e0\n  train_time_per_token_s: 1e-6"))
    s = load_scenario_file(path)
    assert s.trainer.train_time_s == 2.0 and s.trainer.train_time_per_token_s == 1e-6
    path.write_text(sub(GOOD, "train_time_s: 1", "train_time_s: '2e0'"))      # quoted: a string, refused
    with pytest.raises(ConfigError, match="trainer.train_time_s: .*got '2e0'"):
        load_scenario_file(path)


def test_a_trajectory_too_long_for_the_smallest_worker_names_its_class_and_worker(tmp_path):
    text = MIXED.replace("pool:\n  - {accelerator: H800, devices: 2, tp: 1}\n",
                         "pool:\n  - {accelerator: H800, devices: 2, tp: 1}\n  - {accelerator: L40S, devices: 2, tp: 2}\n")
    text = sub(text, "    b: {share: 2, response: {median: 100, cap: 1000}}",
               "    b: {share: 2, response: {median: 100, cap: 1000},\n"
               "        turns: {turns_min: 1, turns_max: 64, observation: {median: 100, cap: 20000}}}")
    result, wall = _run_config(tmp_path, text)
    assert_refused(result, wall, "workload.classes.b")
    assert "H800 TP=1 worker (363,498 tokens)" in result.output and "turns_max" in result.output   # the smaller
    assert not result.output.endswith("\n\n")      # no blank line after it (a progress bar closing off a terminal)
