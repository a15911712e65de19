"""The `Report` context every section takes: where to write, run sizes, the runner, the findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cadencerl.config import ConfigError, Scenario, builtin_names, builtin_scenario
from cadencerl.report.markdown import describe_pool
from cadencerl.report.matrix import Settings
from cadencerl.report.runner import Runner


@dataclass
class Report:
    """What every experiment function needs: where to write, how big the runs are, the runner, the findings."""

    out: Path          # where files are written (a staging directory while the report is built)
    settings: Settings
    runner: Runner
    losses: list[str] = field(default_factory=list)  # CadenceRL measured worse than some baseline
    mismatches: list[str] = field(default_factory=list)  # a paper claim this simulator does not reproduce
    headline: str = ""  # the heterogeneous ratio table, set by `heterogeneous`
    headline_rows: list[list] = field(default_factory=list)  # its rows, for the terminal
    shown_out: Path | None = None  # the directory the report ends up in, as commands in it name it

    def figure(self, name: str) -> tuple[Path, str]:
        """(file path, path relative to report.md) for a PNG."""
        return self.out / "figures" / f"{name}.png", f"figures/{name}.png"

    def run_all(self, scenario: Scenario, policies) -> dict[str, dict]:
        return {p: self.runner.run(scenario, p) for p in policies}

    def command(self, verb: str, scenario: Scenario, policies, *, eta: int | None = None,
                delta: int | None = None) -> str:
        """The `cadencerl sim/compare` command line that reproduces a row run on `scenario` (+ eta/delta)."""
        parts = ["cadencerl", verb, *self._scenario_args(scenario)]
        parts += ["-p", policies] if verb == "sim" else ["--policies", ",".join(policies)]
        parts += ["--seed", str(scenario.seed)]
        if eta is not None:
            parts += ["--eta", str(eta)]
        if delta is not None:
            parts += ["--delta", str(delta)]
        return "`" + " ".join(parts) + "`"

    def _scenario_args(self, s: Scenario) -> list[str]:
        """`-s NAME [--trajectories N] [--batch-size B]` if that rebuilds `s` exactly, else
        `--config DIR/scenarios/NAME.yaml`. (`--trajectories` scales the batch unless `--batch-size`.)"""
        if s.name in builtin_names():
            builtin = builtin_scenario(s.name)
            n, batch = s.workload.trajectories, s.trainer.batch_size
            try:
                rebuilt = builtin.resized(n, batch).with_overrides(seed=s.seed)
            except ConfigError:
                rebuilt = None
            if rebuilt == s:
                extra = [] if n == builtin.workload.trajectories else ["--trajectories", str(n)]
                if batch != builtin.resized(n).trainer.batch_size:
                    extra += ["--batch-size", str(batch)]
                return ["-s", s.name, *extra]
        path = self.out / "scenarios" / f"{s.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(s.model_dump(exclude_none=True), sort_keys=False))
        return ["--config", str((self.shown_out or self.out) / "scenarios" / path.name)]

    def setup_line(self, s: Scenario, **knobs) -> str:
        eta, delta = knobs.get("eta", s.controller.eta), knobs.get("delta", s.cadence.delta)
        return (f"*Setup:* pool {describe_pool(s)}; model {s.model}; {s.workload.trajectories} trajectories, "
                f"trainer batch {s.trainer.batch_size}, seed {s.seed}; eta {eta}, delta {delta} tokens.")
