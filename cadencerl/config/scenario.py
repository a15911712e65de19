"""A scenario: a pool, a model, a workload, a trainer and the knobs, from a built-in or a user's file.

Validated by pydantic so a bad field gets a one-line error naming it (a renamed key names its
replacement); reading the file itself (size, encoding, YAML/TOML syntax) is user_files.py's job.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from cadencerl.config.cadence import CadenceSpec
from cadencerl.config.fields import MAX_WORKERS, SafeName, Strict
from cadencerl.config.pool import WorkerGroup
from cadencerl.config.run import ControllerSpec, TrainerSpec
from cadencerl.config.workload import WorkloadSpec
from cadencerl.hardware import catalog
from cadencerl.hardware.perf import DoesNotFitError, make_perf
from cadencerl.user_files import ConfigError, parse_scenario_file, read_text_file

RENAMED = {
    "policy": "this section is split: eta and tick_s are under controller:, CadenceRL's knobs (delta, "
              "headroom_floor, growth_ticks, pacing, ...) under cadence: (see docs/policies/cadence.md)",
    "affinity": "renamed affinity_order: (accelerator types, the preferred home of tail work first)",
}

KNOB_SECTIONS = {"eta": "controller", "delta": "cadence"}


def merged(data: dict, changes: dict) -> dict:
    """`data` with `changes` merged in, mapping into mapping (a copy; a non-mapping value replaces)."""
    out = dict(data)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class Scenario(Strict):
    name: SafeName
    description: str = Field(default="", max_length=2000)
    model: str
    seed: int = Field(default=0, ge=0, lt=1 << 63)
    pool: list[WorkerGroup] = Field(min_length=1, max_length=256)
    affinity_order: list[str] | None = None     # accelerator types, the preferred home of tail work first
    workload: WorkloadSpec
    trainer: TrainerSpec
    controller: ControllerSpec = ControllerSpec()
    cadence: CadenceSpec = CadenceSpec()
    engine: Literal["vllm-v1"] = "vllm-v1"

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        """A key this release renamed is named with its replacement, not as unknown."""
        if isinstance(data, dict):
            for old, new in RENAMED.items():
                if old in data:
                    raise ValueError(f"{old}: {new}")
        return data

    def trainer_mix(self) -> dict[str, float] | None:
        """The mixture the trainer asks each batch for, or None to take completion order."""
        return self.workload.target_mix() if self.trainer.mix == "target" else None

    @model_validator(mode="after")
    def _check_catalog(self) -> "Scenario":
        model = catalog.model(self.model)
        if (workers := sum(g.workers for g in self.pool)) > MAX_WORKERS:
            raise ValueError(f"pool: {workers:,} workers in all, more than {MAX_WORKERS:,} (every decision looks at "
                             "every worker: a run's wall time grows with the pool); use a larger tp or fewer devices")
        for i, g in enumerate(self.pool):
            acc = catalog.accelerator(g.accelerator, f"pool.{i}.accelerator")
            try:
                make_perf(acc, model, g.tp)
            except DoesNotFitError as exc:
                raise ValueError(f"pool.{i}: {exc}") from None
        if self.affinity_order is not None:
            _check_affinity(self.affinity_order, {g.accelerator for g in self.pool})
        clusters = sorted({g.cluster_name for g in self.pool})
        if self.trainer.cluster is not None and self.trainer.cluster not in clusters:
            raise ValueError(f"trainer.cluster: {self.trainer.cluster!r} is not a cluster of the pool "
                             f"(its clusters: {', '.join(clusters)})")
        if self.trainer.batch_size > self.workload.trajectories:
            raise ValueError(
                f"trainer.batch_size: {self.trainer.batch_size} is more than workload.trajectories "
                f"({self.workload.trajectories}), so the trainer would wait for every trajectory before its first "
                f"step; set trainer.batch_size to at most {self.workload.trajectories} (or --batch-size on the CLI)")
        return self

    def with_overrides(self, **changes) -> "Scenario":
        """A copy with nested fields replaced, e.g. controller={'eta': 3}; re-validated.

        A new `pool` without a new `affinity_order` keeps the order, restricted to its types."""
        data = self.model_dump()
        for key, value in changes.items():     # one level: a section's fields, as given, replace its own
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key].update(value)
            else:
                data[key] = value
        if "pool" in changes and "affinity_order" not in changes and data.get("affinity_order") is not None:
            types = {g.get("accelerator") if isinstance(g, dict) else getattr(g, "accelerator", None)
                     for g in data["pool"]}
            data["affinity_order"] = [a for a in data["affinity_order"] if a in types] or None
        return load_scenario_dict(data)

    def with_knobs(self, **knobs: int) -> "Scenario":
        """A copy with the paper's two knobs set where given: eta (the controller's), delta (CadenceRL's)."""
        changes: dict = {}
        for name, value in knobs.items():
            changes.setdefault(KNOB_SECTIONS[name], {})[name] = value
        return self.with_overrides(**changes)

    def resized(self, trajectories: int, batch_size: int | None = None) -> "Scenario":
        """A copy with `trajectories`; the trainer batch scales with it (the run keeps the scenario's
        number of batches, so the same regime) unless `batch_size` is given."""
        if batch_size is None:      # the scenario's number of batches, the last no larger than the others
            batches = -(-self.workload.trajectories // self.trainer.batch_size)
            batch_size = max(1, min(trajectories, -(-trajectories // batches)))
        return self.with_overrides(workload={"trajectories": trajectories}, trainer={"batch_size": batch_size})


def _check_affinity(affinity: list[str], pool_types: set[str]) -> None:
    """The affinity order ranks every accelerator type of the pool exactly once."""
    seen: set[str] = set()
    for i, name in enumerate(affinity):
        if name not in pool_types:
            raise ValueError(f"affinity_order.{i}: {name!r} is not in the pool (pool types: {sorted(pool_types)})")
        if name in seen:
            raise ValueError(f"affinity_order.{i}: {name!r} is named twice")
        seen.add(name)
    missing = pool_types - seen
    if missing:
        raise ValueError(f"affinity_order: missing accelerator types {sorted(missing)}")


def format_validation_error(exc: ValidationError) -> str:
    """One error as `field.path: message`, one line: a key the model does not know first (a misspelt
    key is otherwise reported as the field it meant being missing), and the value that was refused."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key (misspelt, or not a field here)"
    msg = " ".join(err["msg"].removeprefix("Value error, ").split())
    if err["type"].endswith(("_type", "_parsing")) and isinstance(err.get("input"), (str, int, float, bool)):
        msg += f", got {_shown(err['input'])}"
    if loc and _FIELD_FIRST.match(msg):     # a model's own check names its field: `workload.classes: ...`
        return f"{loc}.{msg}"
    return f"{loc}: {msg}" if loc else msg


_FIELD_FIRST = re.compile(r"^[a-z_][a-z0-9_]*(\.[\w]+)*: ")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def load_scenario_dict(data: dict) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    except catalog.CatalogError as exc:
        raise ConfigError(str(exc)) from None


def load_scenario_file(path: str | Path) -> Scenario:
    """A scenario from a YAML or TOML file; a relative `workload.trace` is relative to the file."""
    path = Path(path)
    data = parse_scenario_file(path, read_text_file(path, "config"))
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path.name} must hold a mapping of scenario fields")
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("trace"), str) and workload["trace"]:
        trace = Path(workload["trace"]).expanduser()
        trace = trace if trace.is_absolute() else path.resolve().parent / trace
        data["workload"] = {**workload, "trace": str(trace)}
    return load_scenario_dict(data)


def builtin_names() -> list[str]:
    root = resources.files("cadencerl") / "scenarios"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def builtin_scenario(name: str) -> Scenario:
    with resources.as_file(resources.files("cadencerl") / "scenarios" / f"{_builtin(name)}.yaml") as path:
        return load_scenario_file(path)


def builtin_text(name: str) -> str:
    """A built-in scenario's file as written (its comments too): the start of a user's own."""
    return (resources.files("cadencerl") / "scenarios" / f"{_builtin(name)}.yaml").read_text(encoding="utf-8")


def _builtin(name: str) -> str:
    names = builtin_names()
    if name not in names:
        raise ConfigError(f"scenario: unknown scenario {name!r} (built-in: {', '.join(names)})")
    return name
