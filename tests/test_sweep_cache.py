"""The sweep cache: names cannot leave the cache directory, writes are atomic, and a corrupt entry
is swept again with a one-line warning instead of being read as bad input."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from cadencerl.admission.gated import placement_of
from cadencerl.config import ConfigError
from cadencerl.runs import sweep as sw
from tests.conftest import small

pytestmark = pytest.mark.timeout(120)
GRID = {"cache_threshold": [0.3, 0.7], "balance_abs_threshold": [16], "balance_rel_threshold": [1.5]}


@pytest.fixture
def scenario():
    return small("h800-16", trajectories=48, batch=16).with_overrides(name="démo: π x")


def test_cache_file_stays_in_the_cache_directory_with_a_safe_name(scenario):
    path = sw.cache_path(scenario, GRID)
    assert path.parent == sw.cache_dir()
    assert path.name.startswith("d_mo_x-") and path.suffix == ".json"


def test_tuned_thresholds_are_cached_atomically(scenario):
    best = sw.tuned_thresholds(scenario, GRID)
    path = sw.cache_path(scenario, GRID)
    assert json.loads(path.read_text())["best"] == best
    assert [p.name for p in path.parent.iterdir()] == [path.name]   # no temporary file left behind
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask         # not tempfile's 0o600


@pytest.mark.parametrize("corrupt", [
    "{\"best\": {\"cache_threshold\": 0.3", "[]", "{\"best\": {\"cache_threshold\": 42}}", "\udcff"],
    ids=["truncated", "not-a-mapping", "off-grid", "not-utf8"])
def test_a_corrupt_entry_is_swept_again_with_a_warning(scenario, caplog, corrupt):
    path = sw.cache_path(scenario, GRID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(corrupt.encode("utf-8", "surrogateescape"))
    with caplog.at_level(logging.WARNING, logger="cadencerl.runs.sweep"):
        best = sw.tuned_thresholds(scenario, GRID)
    assert set(best) == {*GRID, "version_switch"} and best["cache_threshold"] in GRID["cache_threshold"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "\n" not in warnings[0] and str(path) in warnings[0]
    assert json.loads(path.read_text())["best"] == best   # repaired


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_result(scenario, caplog, monkeypatch, tmp_path):
    """Found by a user with a read-only home: the sweep ran, then its result was lost to a
    PermissionError. The cache only saves the next run a sweep."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("CADENCERL_CACHE_DIR", str(tmp_path / "a-file"))       # no folder can be made under it
    with caplog.at_level(logging.WARNING, logger="cadencerl.runs.sweep"):
        best = sw.tuned_thresholds(scenario, GRID)
    assert set(best) == {*GRID, "version_switch"}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "CADENCERL_CACHE_DIR" in warnings[0]


class _Stop(Exception):
    pass


def test_sweep_of_a_big_batch_scenario_keeps_a_valid_batch(monkeypatch):
    """Tuning runs on TUNE_TRAJECTORIES: a batch above that shrinks to fit instead of failing."""
    calls = []

    def first_run_only(tune, policy):
        calls.append(tune)
        raise _Stop

    monkeypatch.setattr(sw, "simulate", first_run_only)
    with pytest.raises(_Stop):
        sw.sweep(small("h800-16", trajectories=5000, batch=4500), GRID)
    assert calls[0].workload.trajectories == sw.TUNE_TRAJECTORIES
    assert calls[0].trainer.batch_size == sw.TUNE_TRAJECTORIES


def test_the_cache_key_changes_with_the_simulating_code(scenario, monkeypatch):
    """A cached best point is only valid for the code that measured it."""
    before = sw.cache_path(scenario, GRID)
    monkeypatch.setattr(sw, "code_fingerprint", lambda: "another-simulator")
    assert sw.cache_path(scenario, GRID) != before


def test_the_fingerprint_follows_every_simulating_source(tmp_path):
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "engine.py").write_text("STEP = 1\n")
    (tmp_path / "config.py").write_text("")
    (tmp_path / "cli.py").write_text("")
    first = sw.source_fingerprint(tmp_path, ("sim",))
    (tmp_path / "cli.py").write_text("changed = True\n")        # not simulating code
    assert sw.source_fingerprint(tmp_path, ("sim",)) == first
    (tmp_path / "sim" / "engine.py").write_text("STEP = 2\n")
    assert sw.source_fingerprint(tmp_path, ("sim",)) != first


def test_the_weight_update_is_tuned_over_several_batches_for_each_system(monkeypatch):
    from cadencerl.policies.routers import CacheAware
    from cadencerl.runs import registry

    long = small("h800-16", trajectories=400, batch=16)
    calls = []
    real = sw.simulate

    def counted(scenario, policy):
        calls.append((scenario.workload.trajectories, policy.name, placement_of(policy).version_switch))
        return real(scenario, policy)

    monkeypatch.setattr(sw, "simulate", counted)
    point = {"cache_threshold": 0.3, "balance_abs_threshold": 16, "balance_rel_threshold": 1.5}
    updates = sw.sweep_version_switch(long, lambda u: CacheAware(**point, version_switch=u))
    n = sw.UPDATE_TUNE_BATCHES * 16
    assert calls == [(n, "cache-aware", u) for u in ("when-idle", "interrupt", "in-place")]
    assert [u["score_tok_s"] for u in updates] == sorted((u["score_tok_s"] for u in updates), reverse=True)
    assert all(u["score_tok_s"] == u["steady_throughput_tok_s"] for u in updates)

    # the tuned router runs its best; MISA-T in front of it keeps the thresholds, its own update is tuned
    monkeypatch.setattr(sw, "tuned_thresholds", lambda s: {**point, "version_switch": "interrupt"})
    assert registry.make_policy("cache-aware-tuned", long).version_switch == "interrupt"
    calls.clear()
    misa = registry.make_policy("misa+cache-aware-tuned", long)
    assert [c[1:] for c in calls] == [("misa+cache-aware-tuned", u) for u in ("when-idle", "interrupt", "in-place")]
    saved = json.loads(sw.cache_path(long, {"policy": ["misa+cache-aware-tuned"]}).read_text())
    best = saved["best"]
    assert best["version_switch"] == max(saved["weight_update_results"], key=lambda u: u["score_tok_s"])["version_switch"]
    assert misa.inner.version_switch == best["version_switch"] and misa.inner.cache_threshold == 0.3
    calls.clear()
    assert registry.make_policy("misa+cache-aware-tuned", long).inner.version_switch == best["version_switch"]
    assert calls == []   # cached
    fixed = registry.make_policy("misa+cache-aware-tuned", long, version_switch="in-place")
    assert fixed.inner.version_switch == "in-place" and calls == []   # fixed: nothing tuned
    assert registry.make_policy("cache-aware-tuned", long, version_switch="when-idle").version_switch == "when-idle"
    with pytest.raises(ConfigError, match="version_switch: 'eager'"):
        registry.make_policy("cache-aware-tuned", long, version_switch="eager")
    with pytest.raises(ConfigError, match="least-loaded is not cache-aware-tuned"):
        registry.make_policy("least-loaded", long, version_switch="interrupt")


def test_a_cached_best_without_a_known_weight_update_is_swept_again(scenario):
    path = sw.cache_path(scenario, GRID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"best": {"cache_threshold": 0.3, "balance_abs_threshold": 16, "balance_rel_threshold": 1.5}}))
    best = sw.tuned_thresholds(scenario, GRID)
    assert best["version_switch"] in sw.VERSION_SWITCHES
    assert json.loads(path.read_text())["best"] == best


@pytest.mark.parametrize("grid", [sw.QUICK_GRID, sw.FULL_GRID], ids=["quick", "full"])
def test_both_grids_hold_both_of_vllm_routers_documented_defaults(grid):
    """Its CLI's 0.3 / 64 / 1.5 and its docs' 0.5 / 32 / 1.1 (they disagree): the sweep starts where a
    user of either would."""
    for default in sw.DOCUMENTED_DEFAULTS:
        assert all(value in grid[knob] for knob, value in default.items()), default


def test_the_first_documented_default_is_what_the_router_runs_untuned():
    """vLLM Router's CLI defaults are what `cache-aware` (simulated) and `cadencerl router` run untuned."""
    from cadencerl.policies.routers import CacheAware
    from cadencerl.router.settings import RouterSettings

    cli_default = sw.DOCUMENTED_DEFAULTS[0]
    simulated = CacheAware()
    assert {k: getattr(simulated, k) for k in cli_default} == cli_default
    assert {k: RouterSettings.model_fields[k].default for k in cli_default} == cli_default


def test_sweep_takes_compares_sizing_so_a_resized_comparison_finds_its_tuning():
    """`compare -s X --trajectories N --policies cache-aware-tuned` tunes on the resized scenario: a
    `sweep` without the same options could not make that tuning ahead of it."""
    from typer.testing import CliRunner

    from cadencerl.cli.main import app
    from cadencerl.config import builtin_scenario

    resized = builtin_scenario("h800-16").resized(64)
    assert not sw.cache_path(resized, sw.QUICK_GRID).exists()
    result = CliRunner().invoke(app, ["sweep", "-s", "h800-16", "--trajectories", "64"])
    assert result.exit_code == 0, result.output
    assert sw.cache_path(resized, sw.QUICK_GRID).exists()
