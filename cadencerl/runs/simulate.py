"""Run one policy on one scenario in simulation and return its figures."""

from __future__ import annotations

import time
from collections.abc import Callable

from cadencerl.config import Scenario
from cadencerl.core.controller import Controller
from cadencerl.core.mix import MixRule
from cadencerl.core.policy import Policy
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker
from cadencerl.hardware import catalog
from cadencerl.runs.assemble import build_pool, check_fits_somewhere
from cadencerl.runs.bounds import add_bounds
from cadencerl.runs.collector import collector_paused
from cadencerl.runs.summary import summarize
from cadencerl.sim.backend import SimBackend
from cadencerl.sim.kv_moves import KvMoves
from cadencerl.sim.links import Links
from cadencerl.sim.weights import WeightSync
from cadencerl.workload.generate import generate


@collector_paused()
def simulate(scenario: Scenario, policy: Policy, *, exact: bool = False,
             progress: Callable[[int, int], None] | None = None, keep: dict | None = None,
             trace: tuple[int, ...] = (), key: object | None = None) -> dict:
    """Simulate `policy` (a fresh one: policies keep state) on `scenario`; the conservation check
    runs before returning.

    `trace` names trajectories whose residency and KV share are recorded at every decision
    (result key `traces`); `keep`, when given, receives the controller and backend. `key` seals
    the lengths; only `runs/reference.py` passes one, the one it also hands its oracle.
    """
    started = time.perf_counter()
    workers, perfs = build_pool(scenario)
    key = object() if key is None else key
    specs = generate(scenario.workload, scenario.seed, key)
    check_fits_somewhere(specs, workers, key, scenario.cadence)
    trajectories = [Trajectory(s) for s in specs]
    links = Links()
    weights = WeightSync(catalog.model(scenario.model).weight_bytes, [w.cluster for w in workers],
                         [w.tp for w in workers], _trainer_cluster(workers, scenario.trainer.cluster),
                         policy.weight_sync, links)
    kv = KvMoves(workers, perfs, links, staging=policy.kv_staging) if policy.kv_transfer else None
    backend = SimBackend(perfs, key, exact=exact, weights=weights, kv=kv)
    ctl = Controller(policy, backend, workers, trajectories, batch_size=scenario.trainer.batch_size,
                     params=scenario.controller, train_time_s=scenario.trainer.train_time_s,
                     train_time_per_token_s=scenario.trainer.train_time_per_token_s,
                     mix=MixRule.maybe(scenario.trainer_mix(), scenario.trainer.mix_wait_s),
                     kv_transfer_time=None if kv is None else lambda src, dst, traj: kv.fetch(
                         traj.id, src, dst, traj.context, backend.now(),
                         backend.engines[dst.id].reprefill_estimate(traj.context)),
                     kv_bytes_per_token=catalog.model(scenario.model).kv_bytes_per_token)
    generated: list[tuple[float, int]] = []

    def on_finish(done: int, total: int) -> None:
        # decoded tokens so far, for the steady window (engines not synced lag by under one tick); the
        # backend's clock is the controller's here, and reading it leaves no cycle through `ctl`, whose
        # run's millions of objects then go by reference counting, not by a collector's pass over them
        generated.append((backend.now(), backend.decoded_tokens()))
        if progress is not None:
            progress(done, total)

    ctl.on_progress = on_finish
    ctl.traced = {tid: [] for tid in trace}
    ctl.run()
    result = summarize(scenario.name, policy.name, ctl, backend.engines, time.perf_counter() - started,
                       backend.events_processed, scenario.workload.target_mix(), generated)
    add_bounds(result, specs, workers, perfs, key, scenario)
    result.update(link_bytes=links.bytes_by_link(), weight_sync=weights.style, weight_updates=weights.updates,
                  weight_wait_s=weights.waited_s, kv_staging=kv is not None and kv.staging,
                  kv_fallbacks=kv.fallbacks if kv is not None else 0)
    if trace:
        result["traces"] = {str(tid): [list(p) for p in pts] for tid, pts in ctl.traced.items()}
    if keep is not None:
        keep.update(controller=ctl, backend=backend)
    return result



def _trainer_cluster(workers: list[Worker], named: str | None) -> str | None:
    """The scenario's `trainer.cluster`, else the H800 workers' cluster if any (the CadenceRL setup
    trains on H800), else None: a cluster of its own."""
    if named is not None:
        return named
    return next((w.cluster for w in workers if w.accelerator == catalog.TRAINER_ACCELERATOR), None)
