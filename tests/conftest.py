"""Shared fixtures: small scenarios that run in well under a second."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from cadencerl import native
from cadencerl.config import Scenario, builtin_scenario
from cadencerl.core.actions import Action
from cadencerl.core.policy import Policy
from cadencerl.core.view import AdmissionGate, PoolView
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


class Watching(Policy):
    """`policy` as the controller sees it, with `watch(view)` run before each of its decisions: a
    compiled policy (`make native`) takes no patched method, so a test watches it from outside."""

    def __init__(self, policy: Policy, watch: Callable[[PoolView], None]) -> None:
        self.inner, self.watch = policy, watch
        self.name, self.kv_transfer, self.kv_staging = policy.name, policy.kv_transfer, policy.kv_staging
        self.weight_sync, self.queues_at_engine = policy.weight_sync, policy.queues_at_engine

    @property
    def gate(self) -> AdmissionGate | None:
        return self.inner.gate

    @property
    def updates_in_place(self) -> bool:
        return self.inner.updates_in_place

    def decide(self, view: PoolView) -> Iterator[Action]:
        self.watch(view)
        yield from self.inner.decide(view)


def ran_in_plain_python(request: pytest.FixtureRequest) -> bool:
    """For a test that patches a class `make native` compiles (a compiled class takes no patch):
    under the compiled modules it runs again in a plain-Python interpreter, the same source, which
    must pass it, and this says True (the test returns); in plain Python it says False."""
    if not native.compiled():
        return False
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
                         cwd=request.config.rootpath, env={**os.environ, native.PURE_ENV: "1"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and re.search(r"^1 passed in ", run.stdout, re.M), \
        f"in plain Python:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    return True
