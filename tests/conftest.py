"""Shared fixtures: small scenarios that run in well under a second."""

from __future__ import annotations

import pytest

from cadencerl.config import Scenario, builtin_scenario
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate


def small(name: str = "16a16b8h", trajectories: int = 192, batch: int = 48, cap: int = 4096, **knobs) -> Scenario:
    """A built-in pool with a short workload, so a whole run takes a fraction of a second. A mixed
    workload keeps its classes' shapes (each class has its own; the workload's would be refused)."""
    workload: dict = {"trajectories": trajectories}
    if builtin_scenario(name).workload.classes is None:
        workload.update(group_size=4, response={"median": min(768, cap), "sigma": 1.0, "cap": cap})
    changes = dict(workload=workload, trainer={"batch_size": batch, "train_time_s": 5.0})
    return builtin_scenario(name).with_overrides(**changes).with_knobs(**knobs)


def sim(scenario: Scenario, policy: str, **kwargs) -> dict:
    """Simulate the policy of that name, as the command line would."""
    return simulate(scenario, make_policy(policy, scenario), **kwargs)


@pytest.fixture
def small_scenario() -> Scenario:
    return small()


@pytest.fixture(autouse=True)
def _private_sweep_cache(tmp_path, monkeypatch):
    """Router sweeps cache their best thresholds on disk: keep each test's cache to itself."""
    monkeypatch.setenv("CADENCERL_CACHE_DIR", str(tmp_path / "cache"))
