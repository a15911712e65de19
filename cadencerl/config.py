"""Scenario files (YAML or TOML), validated by pydantic so a bad field gets a one-line error naming it.

Every number is checked to be finite and inside a sane range, so a scenario that validates also
runs to completion in bounded time (the limits below say what "sane" is; see the README).
Types are strict: `trajectories: true` or `devices: "8"` is an error, not a silent 1 or 8.
Reading the file itself (size, encoding, YAML/TOML syntax) is user_files.py's job.
"""

from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from cadencerl.hardware import catalog
from cadencerl.hardware.perf import DoesNotFitError, make_perf
from cadencerl.user_files import ConfigError, parse_scenario_file, read_text_file

MAX_TRAJECTORIES = 1_000_000      # a run's work grows with it; the built-ins use 16,384
MAX_TOKENS = 1 << 24              # any one length (16M tokens) or a KV cap
MAX_SECONDS = 86_400.0            # any one duration: a day of virtual time
MAX_SIGMA = 5.0                   # log-normal spread; exp(5) is already a factor of 148

_UNSAFE = re.compile(r"[\[\]/\\\x00-\x1f\x7f]")


def _safe_name(value: str) -> str:
    if _UNSAFE.search(value) or value.startswith("."):
        raise ValueError(f"{value!r} may not hold [ ] / \\ or control characters, nor start with '.'")
    return value


# A name shows up in tables, progress bars and cache file names: printable, no markup, no paths.
SafeName = Annotated[str, StringConstraints(min_length=1, max_length=80), AfterValidator(_safe_name)]
Count = Annotated[int, Field(gt=0, le=MAX_TRAJECTORIES)]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Sigma = Annotated[float, Field(ge=0, le=MAX_SIGMA)]


MAX_WORKERS = 4096     # a pool's workers in all; past it a simulated run takes minutes per hundred trajectories


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class WorkerGroup(_Strict):
    """`devices` accelerators of one type, split into workers of `tp` devices each, in one cluster."""

    accelerator: str
    devices: int = Field(gt=0, le=65_536)
    tp: int = Field(default=1, gt=0, le=64)
    cluster: SafeName | None = None
    max_num_seqs: int = Field(default=256, gt=0, le=65_536)

    @model_validator(mode="after")
    def _whole_workers(self) -> "WorkerGroup":
        if self.devices % self.tp:
            raise ValueError(f"devices ({self.devices}) must be a multiple of tp ({self.tp})")
        return self

    @property
    def workers(self) -> int:
        return self.devices // self.tp

    @property
    def cluster_name(self) -> str:
        """Its cluster; unnamed, each accelerator type is a cluster of its own."""
        return self.cluster or self.accelerator


class LengthDist(_Strict):
    """A log-normal body clipped at `cap` (the clipped mass is the point mass at the cap)."""

    median: float = Field(gt=0, le=MAX_TOKENS)
    sigma: Sigma = 1.0
    cap: Tokens
    minimum: Tokens = 1

    @model_validator(mode="after")
    def _ordered(self) -> "LengthDist":
        if self.median > self.cap:
            raise ValueError(f"median ({self.median:g}) must not exceed cap ({self.cap})")
        if self.minimum > self.cap:
            raise ValueError(f"minimum ({self.minimum}) must not exceed cap ({self.cap})")
        return self


class TurnSpec(_Strict):
    """Multi-turn sessions: each turn appends observation tokens and waits on a tool first."""

    turns_min: int = Field(default=1, gt=0, le=1000)
    turns_max: int = Field(default=1, gt=0, le=1000)
    observation: LengthDist = LengthDist(median=200, sigma=0.5, cap=2000)
    tool_latency_median_s: Seconds = 2.0
    tool_latency_sigma: Sigma = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> "TurnSpec":
        if self.turns_min > self.turns_max:
            raise ValueError(f"turns_min ({self.turns_min}) must not exceed turns_max ({self.turns_max})")
        return self


class _Shape(_Strict):
    """How the sessions of one workload look: groups, prompts, replies, turns."""

    group_size: int = Field(default=8, gt=0, le=4096)
    prompt: LengthDist = LengthDist(median=512, sigma=0.5, cap=4096)
    response: LengthDist | None = None
    prompt_difficulty_sigma: Sigma = 0.5
    turns: TurnSpec | None = None


class ClassSpec(_Shape):
    """One workload class of a mixed rollout (RLVR, RLHF, agentic...) and its target share.

    `response` may be left out only when a trace gives the lengths."""

    share: float = Field(gt=0, le=1e6)
    group_size: int = Field(default=1, gt=0, le=4096)


class WorkloadSpec(_Shape):
    trajectories: Count
    trace: str | None = Field(default=None, min_length=1)  # a JSONL file replacing the sampled lengths
    classes: dict[SafeName, ClassSpec] | None = None  # a mixed workload; shares are the trainer's target mix

    @model_validator(mode="after")
    def _one_shape(self) -> "WorkloadSpec":
        if self.classes is not None and not self.classes:
            raise ValueError("classes: give at least one class")
        if self.trace is not None:
            _unused_shape(self, "", "workload.trace gives the lengths")
            for name, cls in (self.classes or {}).items():
                _unused_shape(cls, f"classes.{name}.", "workload.trace gives the lengths")
            return self
        if self.classes is not None:
            _unused_shape(self, "", "each of workload.classes has its own; set it there")
        if self.classes is None and self.response is None:
            raise ValueError("response: required unless classes or a trace are given")
        for name, cls in (self.classes or {}).items():
            if cls.response is None:
                raise ValueError(f"classes.{name}.response: required unless a trace is given")
        return self

    def class_specs(self) -> dict[str, ClassSpec]:
        """Every workload as named classes (a plain workload is the single class 'rlvr')."""
        if self.classes is not None:
            return dict(self.classes)
        shape = {k: getattr(self, k) for k in _Shape.model_fields}
        return {"rlvr": ClassSpec(share=1.0, **shape)}

    def target_mix(self) -> dict[str, float]:
        """The trainer's target class mix; a workload without classes is all 'rlvr' (a trace too)."""
        if self.classes is None:
            return {"rlvr": 1.0}
        total = math.fsum(c.share for c in self.classes.values())
        return {name: c.share / total for name, c in self.classes.items()}


def _unused_shape(spec: _Shape, where: str, why: str) -> None:
    """A shape field given where nothing reads it is refused, not silently dropped (a value equal to
    its default says nothing and passes)."""
    for name in _Shape.model_fields:
        default = type(spec).model_fields[name].default
        if getattr(spec, name) != default:
            raise ValueError(f"{where}{name}: not used here ({why})")


class TrainerSpec(_Strict):
    """`mix`: "target" forms each batch toward the workload's target mix, waiting at most
    `mix_wait_s` for a short class (core/trainer.py); "completion" takes completion order.
    `cluster`: the pool's cluster the trainer sits in (new weights reach its workers over their
    own NICs alone); by default the H800 workers' cluster if the pool has one (the CadenceRL
    setup trains on H800), else a cluster of its own behind the cross-cluster link."""

    batch_size: Count
    train_time_s: Seconds = 10.0
    train_time_per_token_s: float = Field(default=0.0, ge=0, le=1.0)
    mix: Literal["target", "completion"] = "target"
    mix_wait_s: Seconds = 120.0
    cluster: SafeName | None = None


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
    * spread_affinity: while CadenceRL spreads, a prompt's home is taken "tie-break-until-kv-stays-bound"
      (default): whenever feasible once KV has bound under two versions in a row, until then only if it
      ties the least-loaded worker; "tie-break-until-kv-binds" after any bind under the version or the one
      before (`cadence-any-bind`, the previous default); "capped-until-kv-binds" up to the mean load until
      then (`cadence-capped-until-bound`); "home-first" (`cadence-home-first`); "capped" always up to the
      mean (`cadence-capped-affinity`); "tie-break" always (`cadence-balanced-spread`). Version 0 has no
      version before it, so a bind under it alone counts as staying bound.
    * spread_fair_share: while spreading and `spread_affinity` does not take the home whenever feasible
      (by default: until KV stays bound), a worker admits fresh work only up to this multiple of its
      share, by KV capacity, of the pool's residents plus the version's admissible work (default 1.5,
      the best of 1 / 1.5 / 2 on the issue-12 runs); 0 sets no limit (`cadence-no-fair-share`).
    * concentrate_within_one_rank: a version whose workers all share one affinity rank concentrates
      too, draining onto equally fast, fuller workers (`cadence-flat-concentrate`); off (the
      default), such a version keeps pacing after its budget is spent.
    * concentrate_when_kv_bound: CadenceRL drains a version's workers only once KV has bound under it
      (a worker shed below its floor): before that there is no displaced tail, and moving work up the
      affinity order pins the stronger workers to an old version (`cadence-always-concentrate`).
    * drain_needs_pacing_bind: with `concentrate_when_kv_bound`, only a shed while the version paced
      lets its workers drain, not one while it concentrates (its budget spent: one worker's tail
      outgrowing it); on by default. Off (`cadence-any-shed-drain`), every shed counts.
    """

    eta: int = Field(default=1, ge=0, le=1000)
    delta: int = Field(default=1024, ge=0, le=MAX_TOKENS)
    headroom_floor: float = Field(default=0.05, ge=0, lt=1)
    tick_s: float = Field(default=0.5, ge=0.01, le=3600)  # a control decision at most 100 times a virtual second
    kv_preparation: bool = True
    pacing: bool = True
    concentration: bool = True
    prompt_affinity: bool = True
    growth_ticks: float = Field(default=1.0, ge=0, le=100)   # beyond, the floor outgrows any worker's KV
    spread_when_underloaded: bool = True
    drain_needs_fresh_ahead: bool = True
    drain_whole_source: bool = False
    concentrate_when_kv_bound: bool = True
    spread_affinity: Literal["tie-break-until-kv-stays-bound", "tie-break-until-kv-binds", "capped-until-kv-binds",
                             "home-first", "capped", "tie-break"] = "tie-break-until-kv-stays-bound"
    concentrate_within_one_rank: bool = False
    spread_fair_share: float = Field(default=1.5, ge=0, le=1000)
    drain_needs_pacing_bind: bool = True


class Scenario(_Strict):
    name: SafeName
    description: str = Field(default="", max_length=2000)
    model: str
    seed: int = Field(default=0, ge=0, lt=1 << 63)
    pool: list[WorkerGroup] = Field(min_length=1, max_length=256)
    affinity: list[str] | None = None
    workload: WorkloadSpec
    trainer: TrainerSpec
    policy: PolicySpec = PolicySpec()
    engine: Literal["vllm-v1"] = "vllm-v1"

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
        if self.affinity is not None:
            _check_affinity(self.affinity, {g.accelerator for g in self.pool})
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
        """A copy with nested fields replaced, e.g. policy={'eta': 3}; re-validated.

        A new `pool` without a new `affinity` keeps the affinity order, restricted to its types."""
        data = self.model_dump()
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key].update(value)
            else:
                data[key] = value
        if "pool" in changes and "affinity" not in changes and data.get("affinity") is not None:
            types = {g.get("accelerator") if isinstance(g, dict) else getattr(g, "accelerator", None)
                     for g in data["pool"]}
            data["affinity"] = [a for a in data["affinity"] if a in types] or None
        return load_scenario_dict(data)

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
            raise ValueError(f"affinity.{i}: {name!r} is not in the pool (pool types: {sorted(pool_types)})")
        if name in seen:
            raise ValueError(f"affinity.{i}: {name!r} is named twice")
        seen.add(name)
    missing = pool_types - seen
    if missing:
        raise ValueError(f"affinity: missing accelerator types {sorted(missing)}")


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
