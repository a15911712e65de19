"""Tune the cache-aware router the way its users do: a grid over its three thresholds.

The best setting per scenario (highest throughput) is cached on disk, keyed by the scenario's
content, so `cache-aware-tuned` is the sweep-tuned router the MISA-T paper compares against.
Tuning runs use at most `TUNE_TRAJECTORIES` trajectories of the scenario to stay quick.

The grid holds both of vllm-router's documented defaults, which disagree (reference/routers.md):
its CLI parser's 0.3 / 64 / 1.5 (what `cache-aware` runs untuned, and where a user starts) and its
load-balancing docs' 0.5 / 32 / 1.1.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

from cadencerl.config import Scenario
from cadencerl.routing.routers import CacheAware
from cadencerl.runs.simulate import simulate

QUICK_GRID = {"cache_threshold": [0.1, 0.3, 0.5, 0.7], "balance_abs_threshold": [32, 64],
              "balance_rel_threshold": [1.1, 1.5]}
DOCUMENTED_DEFAULTS = ({"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
                       {"cache_threshold": 0.5, "balance_abs_threshold": 32, "balance_rel_threshold": 1.1})
FULL_GRID = {"cache_threshold": [0.1, 0.3, 0.5, 0.7, 0.9], "balance_abs_threshold": [8, 16, 32, 64, 128],
             "balance_rel_threshold": [1.1, 1.5, 2.0]}
TUNE_TRAJECTORIES = 4096


def cache_dir() -> Path:
    return Path(os.environ.get("CADENCERL_CACHE_DIR", Path.home() / ".cache" / "cadencerl")) / "sweeps"


def scenario_key(scenario: Scenario, grid: dict) -> str:
    text = json.dumps([scenario.model_dump(), grid], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sweep(scenario: Scenario, grid: dict | None = None,
          progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Run the cache-aware router at every grid point; results sorted best first."""
    grid = grid or QUICK_GRID
    tune = scenario
    if scenario.workload.trajectories > TUNE_TRAJECTORIES:
        tune = scenario.with_overrides(workload={"trajectories": TUNE_TRAJECTORIES})
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    results = []
    for i, point in enumerate(points):
        r = simulate(tune, CacheAware(**point))
        results.append({**point, "throughput_tok_s": r["throughput_tok_s"], "latency_p95_s": r["latency_p95_s"],
                        "prefix_hit_rate": r["prefix_hit_rate"]})
        if progress:
            progress(i + 1, len(points))
    return sorted(results, key=lambda r: -r["throughput_tok_s"])


def tuned_thresholds(scenario: Scenario, grid: dict | None = None,
                     progress: Callable[[int, int], None] | None = None) -> dict:
    """The best grid point for `scenario`, from the cache or by sweeping now."""
    grid = grid or QUICK_GRID
    path = cache_dir() / f"{scenario.name}-{scenario_key(scenario, grid)}.json"
    if path.is_file():
        return json.loads(path.read_text())["best"]
    results = sweep(scenario, grid, progress)
    best = {k: results[0][k] for k in grid}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"scenario": scenario.name, "grid": grid, "best": best, "results": results}, indent=1))
    return best
