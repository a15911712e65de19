"""Tune the cache-aware router the way its users do: a grid over its three thresholds.

The grid holds both of vllm-router's documented defaults; a second stage tunes how the router's
workers take new weights (`version_switch`) over `UPDATE_TUNE_BATCHES` batches, as it only shows
across publishes. The best setting per scenario is cached on disk, keyed by the scenario and by the
source of the code that decides a simulated result, and is what `cache-aware-tuned` runs. The grid,
the cache and why each stage is sized so: docs/baselines.md, "cache-aware-tuned".
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

from cadencerl.config import Scenario
from cadencerl.core.policy import Policy
from cadencerl.policies.routers import VERSION_SWITCHES as ROUTER_WEIGHT_UPDATES
from cadencerl.policies.routers import CacheAware
from cadencerl.runs.fanout import Fanout
from cadencerl.runs.outputs import write_atomic
from cadencerl.runs.simulate import simulate

QUICK_GRID = {"cache_threshold": [0.1, 0.3, 0.5, 0.7], "balance_abs_threshold": [32, 64],
              "balance_rel_threshold": [1.1, 1.5]}
DOCUMENTED_DEFAULTS = ({"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
                       {"cache_threshold": 0.5, "balance_abs_threshold": 32, "balance_rel_threshold": 1.1})
FULL_GRID = {"cache_threshold": [0.1, 0.3, 0.5, 0.7, 0.9], "balance_abs_threshold": [8, 16, 32, 64, 128],
             "balance_rel_threshold": [1.1, 1.5, 2.0]}
TUNE_TRAJECTORIES = 4096
VERSION_SWITCHES = tuple(ROUTER_WEIGHT_UPDATES)   # when-idle first: a tie keeps the old rule
UPDATE_TUNE_BATCHES = 8
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("CADENCERL_CACHE_DIR", Path.home() / ".cache" / "cadencerl")) / "sweeps"


SIMULATED_BY = ("hardware", "core", "workload", "policies", "admission", "sim", "runs")   # packages a sweep's result depends on


def source_fingerprint(root: Path, packages: tuple[str, ...] = SIMULATED_BY) -> str:
    """A hash of every `.py` file under `root/<package>` and `root/config/`."""
    digest = hashlib.sha256()
    files = sorted(p for pkg in (*packages, "config") for p in (root / pkg).rglob("*.py"))
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@cache
def code_fingerprint() -> str:
    """This installation's simulating code, hashed once per process: a cached best point never outlives it."""
    return source_fingerprint(Path(__file__).resolve().parents[1])


def scenario_key(scenario: Scenario, grid: dict) -> str:
    text = json.dumps([scenario.model_dump(), grid, code_fingerprint()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path(scenario: Scenario, grid: dict) -> Path:
    """`<cache>/<name>-<key>.json`: the name cut to safe characters, so no name leaves the directory."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", scenario.name).strip("_")[:40] or "scenario"
    return cache_dir() / f"{safe}-{scenario_key(scenario, grid)}.json"


def grid_point(scenario: Scenario, point: dict) -> dict:
    """One point of the grid (module level: fanned out)."""
    r = simulate(scenario, CacheAware(**point))
    return {**point, "throughput_tok_s": r["throughput_tok_s"], "latency_p95_s": r["latency_p95_s"],
            "prefix_hit_rate": r["prefix_hit_rate"]}


def sweep(scenario: Scenario, grid: dict | None = None,
          progress: Callable[[int, int], None] | None = None, fanout: Fanout = Fanout()) -> list[dict]:
    """Run the cache-aware router at every grid point (fanned out); results sorted best first."""
    grid = grid or QUICK_GRID
    tune = scenario
    if scenario.workload.trajectories > TUNE_TRAJECTORIES:
        tune = scenario.with_overrides(workload={"trajectories": TUNE_TRAJECTORIES},
                                       trainer={"batch_size": min(scenario.trainer.batch_size, TUNE_TRAJECTORIES)})
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    results = fanout.map(grid_point, [(tune, point) for point in points], progress)
    return sorted(results, key=lambda r: -r["throughput_tok_s"])


def update_tune_batches(scenario: Scenario) -> int:
    """Trainer batches the weight-update stage runs: `UPDATE_TUNE_BATCHES`, or the scenario's if fewer."""
    return min(UPDATE_TUNE_BATCHES, -(-scenario.workload.trajectories // scenario.trainer.batch_size))


def sweep_version_switch(scenario: Scenario, build: Callable[[str], Policy],
                        progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """`build(version_switch)` under each weight update, over `UPDATE_TUNE_BATCHES` batches; best
    steady throughput first (the whole run's where the run is too short for a steady window)."""
    tune = scenario
    if update_tune_batches(scenario) < -(-scenario.workload.trajectories // scenario.trainer.batch_size):
        tune = scenario.with_overrides(workload={"trajectories": UPDATE_TUNE_BATCHES * scenario.trainer.batch_size})
    results = []
    for i, update in enumerate(VERSION_SWITCHES):
        r = simulate(tune, build(update))
        steady = r.get("steady_throughput_tok_s") or None    # absent (or empty) on a run of under 3 batches
        results.append({"version_switch": update, "throughput_tok_s": r["throughput_tok_s"],
                        "steady_throughput_tok_s": steady, "prefix_hit_rate": r["prefix_hit_rate"],
                        "score_tok_s": steady or r["throughput_tok_s"]})
        if progress:
            progress(i + 1, len(VERSION_SWITCHES))
    return sorted(results, key=lambda r: -r["score_tok_s"])


def save(scenario: Scenario, grid: dict, results: list[dict], updates: list[dict]) -> tuple[dict, Path | None]:
    """Cache the best setting of a finished sweep (atomically: a reader never sees half a file); the
    best and where it went. A cache that cannot be written costs the next run a sweep, not this run
    its result: a warning, and no path."""
    best = {**{k: results[0][k] for k in grid}, "version_switch": updates[0]["version_switch"]}
    path = cache_path(scenario, grid)
    text = json.dumps({"scenario": scenario.name, "grid": grid, "best": best, "results": results,
                       "weight_update_results": updates}, indent=1)
    try:
        write_atomic(path, text)
    except OSError as exc:
        log.warning("warning: the sweep cache cannot be written (%s: %s); the result is not kept, set "
                    "CADENCERL_CACHE_DIR to a writable folder", path.parent, exc.strerror or exc)
        return best, None
    return best, path


def _cached_best(path: Path, grid: dict) -> dict | None:
    """The cached best point, or None (with a one-line warning) when the entry is unreadable."""
    try:
        if not path.is_file():
            return None
        best = json.loads(path.read_text(encoding="utf-8"))["best"]
        if set(best) != {*grid, "version_switch"} or not all(best[k] in grid[k] for k in grid) \
                or best["version_switch"] not in VERSION_SWITCHES:
            raise ValueError("its best point is not on the grid")
        return best
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        log.warning("warning: sweep cache entry %s is unreadable (%s); sweeping again", path, exc)
        return None


def tune(scenario: Scenario, grid: dict, progress: Callable[[int, int], None] | None = None,
         update_progress: Callable[[int, int], None] | None = None,
         fanout: Fanout = Fanout()) -> tuple[list[dict], list[dict]]:
    """Both stages: the threshold sweep (fanned out), then the weight update at its best point."""
    results = sweep(scenario, grid, progress, fanout)
    point = {k: results[0][k] for k in grid}
    return results, sweep_version_switch(scenario, lambda u: CacheAware(**point, version_switch=u), update_progress)


def tuned_thresholds(scenario: Scenario, grid: dict | None = None,
                     progress: Callable[[int, int], None] | None = None) -> dict:
    """The best setting for `scenario` (grid point and weight update), from the cache or by sweeping now."""
    grid = grid or QUICK_GRID
    best = _cached_best(cache_path(scenario, grid), grid)
    if best is None:
        best, _ = save(scenario, grid, *tune(scenario, grid, progress))
    return best


def tuned_version_switch(scenario: Scenario, label: str, build: Callable[[str], Policy]) -> str:
    """The weight update that serves `build` best on `scenario` (the sweep's second stage, for a
    policy in front of the tuned router: each system gets its own best), cached like a sweep."""
    grid = {"policy": [label]}
    best = _cached_best(cache_path(scenario, grid), grid)
    if best is None:
        best, _ = save(scenario, grid, [{"policy": label}], sweep_version_switch(scenario, build))
    return best["version_switch"]
