"""Scenario files (YAML or TOML), validated by pydantic so a bad field gets a one-line error naming it."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cadencerl.hardware import catalog
from cadencerl.hardware.perf import DoesNotFitError, make_perf


class ConfigError(ValueError):
    """Bad user input; the message is one line that names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerGroup(_Strict):
    """`devices` accelerators of one type, split into workers of `tp` devices each, in one cluster."""

    accelerator: str
    devices: int = Field(gt=0)
    tp: int = Field(default=1, gt=0)
    cluster: str | None = None
    max_num_seqs: int = Field(default=256, gt=0)

    @model_validator(mode="after")
    def _whole_workers(self) -> "WorkerGroup":
        if self.devices % self.tp:
            raise ValueError(f"devices ({self.devices}) must be a multiple of tp ({self.tp})")
        return self

    @property
    def workers(self) -> int:
        return self.devices // self.tp


class LengthDist(_Strict):
    """A log-normal body clipped at `cap` (the clipped mass is the point mass at the cap)."""

    median: float = Field(gt=0)
    sigma: float = Field(default=1.0, ge=0)
    cap: int = Field(gt=0)
    minimum: int = Field(default=1, gt=0)


class TurnSpec(_Strict):
    """Multi-turn sessions: each turn appends observation tokens and waits on a tool first."""

    turns_min: int = Field(default=1, gt=0)
    turns_max: int = Field(default=1, gt=0)
    observation: LengthDist = LengthDist(median=200, sigma=0.5, cap=2000)
    tool_latency_median_s: float = Field(default=2.0, ge=0)
    tool_latency_sigma: float = Field(default=1.0, ge=0)


class _Shape(_Strict):
    """How the sessions of one workload look: groups, prompts, replies, turns."""

    group_size: int = Field(default=8, gt=0)
    prompt: LengthDist = LengthDist(median=512, sigma=0.5, cap=4096)
    response: LengthDist | None = None
    prompt_difficulty_sigma: float = Field(default=0.5, ge=0)
    turns: TurnSpec | None = None


class ClassSpec(_Shape):
    """One workload class of a mixed rollout (RLVR, RLHF, agentic...) and its target share."""

    share: float = Field(gt=0)
    group_size: int = Field(default=1, gt=0)
    response: LengthDist


class WorkloadSpec(_Shape):
    trajectories: int = Field(gt=0)
    trace: str | None = None  # a JSONL file replacing the sampled lengths
    classes: dict[str, ClassSpec] | None = None  # a mixed workload; shares are the trainer's target mix

    @model_validator(mode="after")
    def _one_shape(self) -> "WorkloadSpec":
        if self.classes is None and self.response is None and self.trace is None:
            raise ValueError("response: required unless classes or a trace are given")
        if self.classes is not None and not self.classes:
            raise ValueError("classes: give at least one class")
        return self

    def class_specs(self) -> dict[str, ClassSpec]:
        """Every workload as named classes (a plain workload is the single class 'rlvr')."""
        if self.classes is not None:
            return dict(self.classes)
        shape = {k: getattr(self, k) for k in _Shape.model_fields}
        return {"rlvr": ClassSpec(share=1.0, **shape)}

    def target_mix(self) -> dict[str, float]:
        specs = self.class_specs()
        total = sum(c.share for c in specs.values())
        return {name: c.share / total for name, c in specs.items()}


class TrainerSpec(_Strict):
    batch_size: int = Field(gt=0)
    train_time_s: float = Field(default=10.0, ge=0)
    train_time_per_token_s: float = Field(default=0.0, ge=0)


class PolicySpec(_Strict):
    """Knobs shared by the policies; each policy documents which it reads.

    * eta: the admission budget (every policy): fresh work may run eta versions ahead of training.
    * delta: CadenceRL's decode reserve, tokens kept free once per pacing placement (paper App. B).
    * headroom_floor: CadenceRL's floor, a fraction of each worker's KV.
    * tick_s: time between two decisions of the controller.
    * kv_preparation: CadenceRL stages KV so compatible moves skip re-prefill (off: `cadence-no-kv-prep`).
    * pacing: CadenceRL evicts the longest resident of a worker below the floor (off: `cadence-no-pacing`).
    * concentration: CadenceRL drains the residual tail by affinity once a version's budget is spent
      (off: that version keeps pacing rules; `cadence-no-concentration`).
    * prompt_affinity: CadenceRL places samples of one prompt where the last one went, when feasible
      (off: `cadence-no-affinity`).
    * growth_ticks: decision ticks of KV growth the floor also covers, so pacing evicts before the
      engine would preempt (the growth rate is observed between decisions).
    * spread_when_underloaded: CadenceRL's tight fit only while KV binds (a version has pending work);
      otherwise it spreads fresh work to the least-loaded feasible worker.
    * drain_needs_fresh_ahead, drain_whole_source: gates beyond the paper's "pending set is empty"
      (drain only when a newer version has fresh work; only if the targets can take every resident
      of the source at once). The first is on (without it a drained worker has nowhere to go and its
      residents come back: the ablation `cadence-eager-drain` shows the loss), the second off.
    """

    eta: int = Field(default=1, ge=0)
    delta: int = Field(default=1024, ge=0)
    headroom_floor: float = Field(default=0.05, ge=0, lt=1)
    tick_s: float = Field(default=0.5, gt=0)
    kv_preparation: bool = True
    pacing: bool = True
    concentration: bool = True
    prompt_affinity: bool = True
    growth_ticks: float = Field(default=1.0, ge=0)
    spread_when_underloaded: bool = True
    drain_needs_fresh_ahead: bool = True
    drain_whole_source: bool = False


class Scenario(_Strict):
    name: str
    description: str = ""
    model: str
    seed: int = 0
    pool: list[WorkerGroup] = Field(min_length=1)
    affinity: list[str] | None = None
    workload: WorkloadSpec
    trainer: TrainerSpec
    policy: PolicySpec = PolicySpec()
    engine: Literal["vllm-v1"] = "vllm-v1"

    @model_validator(mode="after")
    def _check_catalog(self) -> "Scenario":
        model = catalog.model(self.model)
        for i, g in enumerate(self.pool):
            acc = catalog.accelerator(g.accelerator, f"pool.{i}.accelerator")
            try:
                make_perf(acc, model, g.tp)
            except DoesNotFitError as exc:
                raise ValueError(f"pool.{i}: {exc}") from None
        if self.affinity is not None:
            types = {g.accelerator for g in self.pool}
            missing = types - set(self.affinity)
            if missing:
                raise ValueError(f"affinity: missing accelerator types {sorted(missing)}")
        return self

    def with_overrides(self, **changes) -> "Scenario":
        """A copy with nested fields replaced, e.g. policy={'eta': 3}; re-validated."""
        data = self.model_dump()
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key].update(value)
            else:
                data[key] = value
        return load_scenario_dict(data)


def format_validation_error(exc: ValidationError) -> str:
    """The first error as `field.path: message`, one line."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "scenario"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}"


def load_scenario_dict(data: dict) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    except catalog.CatalogError as exc:
        raise ConfigError(str(exc)) from None


def load_scenario_file(path: str | Path) -> Scenario:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config: no such file {str(path)!r}")
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"config: {path.name} is not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path.name} must hold a mapping of scenario fields")
    return load_scenario_dict(data)


def builtin_names() -> list[str]:
    root = resources.files("cadencerl") / "scenarios"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def builtin_scenario(name: str) -> Scenario:
    names = builtin_names()
    if name not in names:
        raise ConfigError(f"scenario: unknown scenario {name!r} (built-in: {', '.join(names)})")
    with resources.as_file(resources.files("cadencerl") / "scenarios" / f"{name}.yaml") as path:
        return load_scenario_file(path)
