"""Running the matrix: every (scenario, policy, trace) simulated once, on a process pool up front.

Results do not depend on the number of processes: each run is seeded, and records keep job order.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cadencerl.config import Scenario
from cadencerl.runs.steady import steady_view


class ReportError(RuntimeError):
    """A run of the matrix failed; the message names the scenario and policy."""


def _setup(s: Scenario) -> dict:
    return {"model": s.model, "seed": s.seed, "pool": [g.model_dump() for g in s.pool],
            "trajectories": s.workload.trajectories, "batch_size": s.trainer.batch_size,
            "eta": s.controller.eta, "delta": s.cadence.delta}


def simulate_one(scenario: Scenario, policy: str, trace: tuple[int, ...] = (), progress=None) -> dict:
    """simulate(), with a failing run turned into a ReportError naming it (top level: worker processes call it)."""
    from cadencerl.config import ConfigError
    from cadencerl.core.actions import ActionError
    from cadencerl.core.controller import StallError
    from cadencerl.runs.reference import REFERENCE, clairvoyant_reference
    from cadencerl.runs.registry import grouped_label, make_policy
    from cadencerl.runs.simulate import simulate

    try:
        if policy == REFERENCE:   # the clairvoyant reference: no registered name resolves to it
            return clairvoyant_reference(scenario, progress)
        name, grouped = grouped_label(policy)
        return simulate(scenario, make_policy(name, scenario, grouped=grouped), trace=trace, progress=progress)
    except (ConfigError, StallError, ActionError) as exc:
        raise ReportError(f"{scenario.name} / {policy}: {exc}") from None


class Runner:
    """Runs simulate() once per (scenario, policy, trace), caching, with a rich progress bar on stderr.

    `prefetch` runs a list of jobs on several processes up front; `run` serves from the cache or runs
    in this process (with a per-run bar). `run` returns the steady window's figures in place of the
    whole run's (`runs.steady.steady_view`); `records` (results.json) keep both, as simulate gave them.
    """

    def __init__(self, progress: Progress | None = None, planned: int = 0) -> None:
        self.progress = progress
        self.cache: dict[tuple, dict] = {}
        self.records: list[dict] = []
        self.overall = progress.add_task("report: runs", total=planned) if progress else None

    @staticmethod
    def key(scenario: Scenario, policy: str, trace: tuple[int, ...] = ()) -> tuple:
        return scenario.model_dump_json(), policy, trace

    def prefetch(self, jobs: list[tuple[Scenario, str]], processes: int, ray_address: str | None = None) -> None:
        """Run the uncached (scenario, policy) jobs on `processes` worker processes, or on the Ray
        cluster at `ray_address` (runs/fanout.py: one code path); results land in the cache."""
        from cadencerl.runs.fanout import Fanout

        todo = [(s, p) for s, p in jobs if self.key(s, p) not in self.cache]
        if ray_address is None and (processes <= 1 or len(todo) <= 1):
            for s, p in todo:
                self.run(s, p)
            return
        seen = [0]

        def advance(done: int, _total: int) -> None:
            while seen[0] < done:
                seen[0] += 1
                self._advance()

        results = Fanout(processes, ray_address).map(simulate_one, todo, advance)
        for (s, p), result in zip(todo, results):  # record in job order, whatever order they finished in
            self._store(s, p, (), result)

    def run(self, scenario: Scenario, policy: str, trace: tuple[int, ...] = ()) -> dict:
        key = self.key(scenario, policy, trace)
        if key in self.cache:
            return steady_view(self.cache[key])
        task = None
        if self.progress:
            task = self.progress.add_task(f"  {scenario.name} / {policy}", total=scenario.workload.trajectories)
        try:
            result = simulate_one(scenario, policy, trace, progress=(
                (lambda done, _total: self.progress.update(task, completed=done)) if task is not None else None))
        finally:
            if task is not None:
                self.progress.remove_task(task)
        self._advance()
        return steady_view(self._store(scenario, policy, trace, result))

    def _store(self, scenario: Scenario, policy: str, trace: tuple[int, ...], result: dict) -> dict:
        self.cache[self.key(scenario, policy, trace)] = result
        self.records.append({**result, "setup": _setup(scenario)})
        return result

    def _advance(self) -> None:
        if not self.progress:
            return
        overall = self.progress.tasks[self.overall]
        if overall.completed >= (overall.total or 0):  # an unplanned run: grow the bar rather than overflow it
            self.progress.update(self.overall, total=(overall.total or 0) + 1)
        self.progress.advance(self.overall)


def progress_bar(enabled: bool) -> Progress:
    """A transient bar on stderr, so stdout stays clean for `--json -`; off where stderr is not a terminal
    (a log file or a pipe would get no bar, only the blank line rich writes as it closes one)."""
    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not (enabled and console.is_terminal))
