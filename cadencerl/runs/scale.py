"""A scenario at K times its size: every worker group K times its devices, the workload and the
trainer batch K times theirs, so the run keeps its number of batches and its KV pressure per worker.
The scale the speed benchmark and the planner's big-pool figures run at."""

from __future__ import annotations

from cadencerl.config import ConfigError, Scenario


def scaled(scenario: Scenario, k: int, trajectories: int | None = None) -> Scenario:
    """`scenario` with K times the devices, trajectories and batch (`trajectories`, if given,
    replaces K times the scenario's; the batch still scales by K)."""
    if k < 1:
        raise ConfigError(f"scale: expected an integer >= 1, got {k}")
    pool = [g.model_dump() | {"devices": g.devices * k} for g in scenario.pool]
    n = scenario.workload.trajectories * k if trajectories is None else trajectories
    return scenario.with_overrides(pool=pool, workload={"trajectories": n},
                                   trainer={"batch_size": min(n, scenario.trainer.batch_size * k)})
