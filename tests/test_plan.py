"""The planner (`cadencerl plan`, runs/plan.py) and the fan-out it shares with sensitivity, sweep and report."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app
from cadencerl.config import ConfigError
from cadencerl.runs import plan
from cadencerl.runs.fanout import Fanout
from cadencerl.runs.prices import catalog_prices, load_prices, prices_for
from tests.conftest import small

runner = CliRunner()
GRID = "H800:0,1,8;A910X:0,2,16"     # 8 pools; 2 A910X's bound falls below the best found, so it is pruned


def base():
    return small("16a16b8h", trajectories=2048, batch=512)


def best_key(r: dict) -> tuple:
    b = r["best"]
    return b["pool"], b["eta"], b["throughput_tok_s"]


def test_branch_and_bound_finds_the_exhaustive_best_on_a_small_grid():
    s = base()
    cands = plan.parse_candidates(GRID, s)
    prices = prices_for([c.accelerator for c in cands], None)
    full = plan.search(s, cands, prices, None, etas=(1, 2), exhaustive=True, wave=2)
    pruned = plan.search(s, cands, prices, None, etas=(1, 2), wave=2)
    assert len(full["runs"]) == 16 and not full["pools_pruned"]
    assert pruned["pools_pruned"] and len(pruned["runs"]) < len(full["runs"])    # the bound did prune
    assert best_key(pruned) == best_key(full)
    ran = max((r for r in full["runs"]), key=lambda r: (r["throughput_tok_s"], -r["latency_p95_s"]))
    assert best_key(full) == (ran["pool"], ran["eta"], ran["throughput_tok_s"])
    # each pruned pool's bound is below the best, and no run beat its own bound (the pruning was safe)
    assert all(p["bound_tok_s"] < full["best"]["throughput_tok_s"] for p in pruned["pools_pruned"])
    assert not full["bound_violations"]
    for r in full["runs"]:      # conservation: every trajectory of every run completed, once
        assert r["trajectories"] == 2048
    # the frontier: nothing on it is dominated by any run
    for f in full["frontier"]:
        assert not any(o["throughput_tok_s"] > f["throughput_tok_s"] and o["latency_p95_s"] < f["latency_p95_s"]
                       and o["tokens_per_dollar"] > f["tokens_per_dollar"] for o in full["runs"])


def test_budget_bounds_the_search():
    s = base()
    cands = plan.parse_candidates(GRID, s)
    r = plan.search(s, cands, prices_for(["H800", "A910X"], None), 12.0, exhaustive=True, wave=4)
    assert r["pools_over_budget"] == 4       # every pool with 8 H800 ($16/h), and 1 H800 + 16 A910X ($12.72/h)
    assert all(x["cost_per_hour"] <= 12.0 for x in r["runs"])
    assert r["best"]["pool"] == "16 A910X"   # of the four within $12/h, the fastest (and all four ran)
    assert len(r["runs"]) == 4


def test_process_fanout_equals_inline():
    s = small("16a16b8h", trajectories=192, batch=48)
    jobs = [(s.with_knobs(eta=e), "cadence") for e in (1, 2, 3)]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rs]  # noqa: E731
    assert strip(Fanout(2).map(plan.evaluate, jobs)) == strip(Fanout(1).map(plan.evaluate, jobs))


@pytest.mark.parametrize("text, field", [
    ("prices: {H800: {per_hour: 2.5}}", "prices.H800.source"),
    ("prices: {H800: {per_hour: -1, source: x}}", "prices.H800.per_hour"),
    ("prices: {H800: {per_hour: '2', source: x}}", "prices.H800.per_hour"),
    ("prices: {H801: {per_hour: 2, source: x}}", "prices.H801"),
    ("prices: {H800: {per_hour: 2, source: x, cur: usd}}", "prices.H800.cur"),
    ("cost: {}", "prices"),
    ("prices: [", "config"),
])
def test_bad_prices_file_is_one_line_naming_the_field(tmp_path, text, field):
    p = tmp_path / "prices.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_prices(p)
    assert str(exc.value).startswith(field + ":") and "\n" not in str(exc.value)
    r = runner.invoke(app, ["plan", "-s", "16a16b8h", "--trajectories", "64", "--prices", str(p)])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0 and field in r.output


def test_plan_cli_catalog_prices_then_a_users_file(tmp_path):
    args = ["plan", "-s", "16a16b8h", "--trajectories", "256", "--batch-size", "64", "--etas", "1", "--jobs", "1"]
    r = runner.invoke(app, args + ["--candidates", "H800:0,4;A910X:0,16", "--budget", "20",
                                   "--json", str(tmp_path / "a.json"), "--plot", str(tmp_path / "f.png")])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["prices"]["H800"] == {"per_hour": 2.0, "source": catalog_prices()["H800"].source}
    assert data["best"]["cost_per_hour"] <= 20 and "best:" in r.output and (tmp_path / "f.png").stat().st_size > 0
    # H100 has no catalog price: refused in one line, then planned with the user's
    r = runner.invoke(app, args + ["--candidates", "H100:0,4;A910X:0,16"])
    assert r.exit_code == 2 and "no price for H100" in r.output
    prices = tmp_path / "p.yaml"
    prices.write_text("prices:\n  H100: {per_hour: 2.4, source: 'my quote, 2026-12'}\n")
    r = runner.invoke(app, args + ["--candidates", "H100:0,4;A910X:0,16", "--prices", str(prices),
                                   "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["prices"]["H100"]["source"] == "my quote, 2026-12" and len(data["runs"]) == 3


@pytest.mark.parametrize("text", ["H800", "H800:", "H900:0,8", "H800:0,x", "A910X@2:0,3", "H800:0,8;H800:16"])
def test_bad_candidates_are_one_line(text):
    with pytest.raises(ConfigError) as exc:
        plan.parse_candidates(text, base())
    assert str(exc.value).startswith("candidates.") and "\n" not in str(exc.value)
