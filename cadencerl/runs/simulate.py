"""Run one policy on one scenario in simulation and return its figures."""

from __future__ import annotations

import time
from collections.abc import Callable

from cadencerl.config import Scenario
from cadencerl.core.controller import Controller
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.view import Policy
from cadencerl.hardware import catalog
from cadencerl.runs.assemble import build_pool, check_fits_somewhere
from cadencerl.runs.bounds import add_bounds
from cadencerl.runs.summary import summarize
from cadencerl.sim.backend import SimBackend
from cadencerl.workload.generate import generate


def simulate(scenario: Scenario, policy: Policy, *, exact: bool = False,
             progress: Callable[[int, int], None] | None = None, keep: dict | None = None,
             trace: tuple[int, ...] = ()) -> dict:
    """Simulate `policy` (a fresh one: policies keep state) on `scenario`; the conservation check
    runs before returning.

    `trace` names trajectories whose residency and KV share are recorded at every decision
    (result key `traces`); `keep`, when given, receives the controller and backend.
    """
    started = time.perf_counter()
    workers, perfs = build_pool(scenario)
    key = object()
    specs = generate(scenario.workload, scenario.seed, key)
    check_fits_somewhere(specs, workers, key)
    trajectories = [Trajectory(s) for s in specs]
    backend = SimBackend(perfs, key, exact=exact)
    link = catalog.LINKS["intra-cluster"]
    ctl = Controller(policy, backend, workers, trajectories, batch_size=scenario.trainer.batch_size,
                     params=scenario.policy, train_time_s=scenario.trainer.train_time_s,
                     train_time_per_token_s=scenario.trainer.train_time_per_token_s,
                     kv_transfer_time=lambda src, dst, tokens: perfs[dst.id].kv_transfer_time(tokens, link),
                     kv_bytes_per_token=catalog.model(scenario.model).kv_bytes_per_token)
    generated: list[tuple[float, int]] = []

    def on_finish(done: int, total: int) -> None:
        # decoded tokens so far, for the steady window (engines not synced lag by under one tick)
        generated.append((ctl.now, sum(e.tokens_generated + len(e.running) * e.lag for e in backend.engines)))
        if progress is not None:
            progress(done, total)

    ctl.on_progress = on_finish
    ctl.traced = {tid: [] for tid in trace}
    ctl.run()
    result = summarize(scenario.name, policy.name, ctl, backend.engines, time.perf_counter() - started,
                       backend.events_processed, scenario.workload.target_mix(), generated)
    add_bounds(result, specs, workers, perfs, key)
    if trace:
        result["traces"] = {str(tid): [list(p) for p in pts] for tid, pts in ctl.traced.items()}
    if keep is not None:
        keep.update(controller=ctl, backend=backend)
    return result

