"""Tune the cache-aware router the way its users do: a grid over its three thresholds.

The best setting per scenario (highest throughput) is cached on disk, keyed by the scenario's
content and by the source of the code that decides a simulated result (a changed simulator or
router re-tunes), so `cache-aware-tuned` is the sweep-tuned router the MISA-T paper compares against.
Tuning runs use at most `TUNE_TRAJECTORIES` trajectories of the scenario to stay quick.

The grid holds both of vllm-router's documented defaults, which disagree (reference/routers.md):
its CLI parser's 0.3 / 64 / 1.5 (what `cache-aware` runs untuned, and where a user starts) and its
load-balancing docs' 0.5 / 32 / 1.1.
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
from cadencerl.routing.routers import CacheAware
from cadencerl.runs.outputs import write_atomic
from cadencerl.runs.simulate import simulate

QUICK_GRID = {"cache_threshold": [0.1, 0.3, 0.5, 0.7], "balance_abs_threshold": [32, 64],
              "balance_rel_threshold": [1.1, 1.5]}
DOCUMENTED_DEFAULTS = ({"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
                       {"cache_threshold": 0.5, "balance_abs_threshold": 32, "balance_rel_threshold": 1.1})
FULL_GRID = {"cache_threshold": [0.1, 0.3, 0.5, 0.7, 0.9], "balance_abs_threshold": [8, 16, 32, 64, 128],
             "balance_rel_threshold": [1.1, 1.5, 2.0]}
TUNE_TRAJECTORIES = 4096
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("CADENCERL_CACHE_DIR", Path.home() / ".cache" / "cadencerl")) / "sweeps"


SIMULATED_BY = ("hardware", "core", "workload", "routing", "sim", "runs")   # packages a sweep's result depends on


def source_fingerprint(root: Path, packages: tuple[str, ...] = SIMULATED_BY) -> str:
    """A hash of every `.py` file under `root/<package>` and of `root/config.py`."""
    digest = hashlib.sha256()
    files = sorted(p for pkg in packages for p in (root / pkg).rglob("*.py")) + [root / "config.py"]
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


def sweep(scenario: Scenario, grid: dict | None = None,
          progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Run the cache-aware router at every grid point; results sorted best first."""
    grid = grid or QUICK_GRID
    tune = scenario
    if scenario.workload.trajectories > TUNE_TRAJECTORIES:
        tune = scenario.with_overrides(workload={"trajectories": TUNE_TRAJECTORIES},
                                       trainer={"batch_size": min(scenario.trainer.batch_size, TUNE_TRAJECTORIES)})
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    results = []
    for i, point in enumerate(points):
        r = simulate(tune, CacheAware(**point))
        results.append({**point, "throughput_tok_s": r["throughput_tok_s"], "latency_p95_s": r["latency_p95_s"],
                        "prefix_hit_rate": r["prefix_hit_rate"]})
        if progress:
            progress(i + 1, len(points))
    return sorted(results, key=lambda r: -r["throughput_tok_s"])


def save(scenario: Scenario, grid: dict, results: list[dict]) -> tuple[dict, Path]:
    """Cache the best point of a finished sweep (atomically: a reader never sees half a file)."""
    best = {k: results[0][k] for k in grid}
    path = cache_path(scenario, grid)
    text = json.dumps({"scenario": scenario.name, "grid": grid, "best": best, "results": results}, indent=1)
    write_atomic(path, text)
    return best, path


def _cached_best(path: Path, grid: dict) -> dict | None:
    """The cached best point, or None (with a one-line warning) when the entry is unreadable."""
    if not path.is_file():
        return None
    try:
        best = json.loads(path.read_text(encoding="utf-8"))["best"]
        if set(best) != set(grid) or not all(best[k] in grid[k] for k in grid):
            raise ValueError("its best point is not on the grid")
        return best
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        log.warning("warning: sweep cache entry %s is unreadable (%s); sweeping again", path, exc)
        return None


def tuned_thresholds(scenario: Scenario, grid: dict | None = None,
                     progress: Callable[[int, int], None] | None = None) -> dict:
    """The best grid point for `scenario`, from the cache or by sweeping now."""
    grid = grid or QUICK_GRID
    best = _cached_best(cache_path(scenario, grid), grid)
    if best is None:
        best, _ = save(scenario, grid, sweep(scenario, grid, progress))
    return best
