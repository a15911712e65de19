"""Run one policy on one scenario in simulation and return its figures."""

from __future__ import annotations

import time
from collections.abc import Callable

from cadencerl.config import ConfigError, Scenario
from cadencerl.core.controller import Controller
from cadencerl.core.trajectory import Trajectory
from cadencerl.hardware import catalog
from cadencerl.metrics import summarize
from cadencerl.policies.registry import make_policy
from cadencerl.sim.backend import SimBackend
from cadencerl.sim.pool import build_pool
from cadencerl.sim.workload import generate


def simulate(scenario: Scenario, policy_name: str, *, exact: bool = False,
             progress: Callable[[int, int], None] | None = None, keep: dict | None = None) -> dict:
    """Simulate `policy_name` on `scenario`; the conservation check runs before returning.

    `keep`, when given, receives the controller and backend for callers that want the traces.
    """
    started = time.perf_counter()
    workers, perfs = build_pool(scenario)
    key = object()
    specs = generate(scenario.workload, scenario.seed, key)
    _check_fits_somewhere(specs, workers, key)
    trajectories = [Trajectory(s) for s in specs]
    backend = SimBackend(perfs, key, exact=exact)
    link = catalog.LINKS["intra-cluster"]
    policy = make_policy(policy_name, scenario)
    ctl = Controller(policy, backend, workers, trajectories, batch_size=scenario.trainer.batch_size,
                     params=scenario.policy, train_time_s=scenario.trainer.train_time_s,
                     train_time_per_token_s=scenario.trainer.train_time_per_token_s,
                     kv_transfer_time=lambda src, dst, tokens: perfs[dst.id].kv_transfer_time(tokens, link),
                     kv_bytes_per_token=catalog.model(scenario.model).kv_bytes_per_token)
    ctl.on_progress = progress
    ctl.run()
    result = summarize(scenario.name, policy.name, ctl, backend.engines, time.perf_counter() - started,
                       backend.events_processed)
    if keep is not None:
        keep.update(controller=ctl, backend=backend)
    return result


def _check_fits_somewhere(specs, workers, key) -> None:
    """A trajectory longer than every worker's KV could never run: say so before starting."""
    largest = max(w.kv_capacity for w in workers)
    for s in specs:
        total = s.prompt_len + s.response.reveal(key) + sum(t.observation_len + t.response.reveal(key)
                                                            for t in s.later_turns)
        if total > largest:
            raise ConfigError(f"workload: trajectory {s.id} needs {total} KV tokens, more than any worker holds "
                              f"({largest})")
