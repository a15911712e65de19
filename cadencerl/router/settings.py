"""The router's settings, validated so that bad input gets one line naming the field.

Class shares come from `--classes FILE` (a mapping `class: share`, optionally `default: CLASS`) or
from a scenario file's `workload.classes` (`--config`); without either, the paper's mix of agentic,
RLVR and RLHF work (48.6 : 33.1 : 18.2, MISA-T's evaluation mix as issue 14 states it).
"""

from __future__ import annotations

import importlib
import json
import tomllib
from pathlib import Path

import yaml
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cadencerl.config import ConfigError, format_validation_error, load_scenario_file
from cadencerl.core.journal import Journal, JournalError
from cadencerl.engine.urls import check_server_url
from cadencerl.router.policy import router_policy

DEFAULT_MIX = {"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2}
ADMIN_TOKEN_ENV = "CADENCERL_ROUTER_ADMIN_TOKEN"


def rust_data_path_built() -> bool:
    """Can the Rust data path (`make router-native`) be loaded here?"""
    try:
        importlib.import_module("cadencerl.router._datapath")
    except ImportError:
        return False
    return True


class RouterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    workers: list[str] = Field(min_length=1)
    policy: str = Field(default="misa+cache-aware", min_length=1)   # a registry name (router/policy.py)
    scenario_file: str | None = None       # --config: the policy's knobs (controller:, cadence:)
    classes: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_MIX))
    default_class: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    cache_threshold: float = Field(default=0.3, ge=0, le=1)
    balance_abs_threshold: int = Field(default=64, ge=0)
    balance_rel_threshold: float = Field(default=1.5, ge=1)
    eviction_interval_s: float = Field(default=120.0, gt=0)
    max_tree_size: int = Field(default=2**24, gt=0)
    hold_max: int = Field(default=1024, ge=0)            # sessions waiting for admission
    hold_timeout_s: float = Field(default=30.0, gt=0)    # longest wait before a 429
    max_concurrent_requests: int = Field(default=0, ge=0)  # placement-only policies' bound (backpressure.py)
    session_ttl_s: float = Field(default=60.0, gt=0)     # a parked session with no next turn ends
    contended_ttl_s: float = Field(default=15.0, gt=0)   # ... after this long while new sessions wait
    max_sessions: int = Field(default=100_000, gt=0)     # parked sessions kept (oldest end first)
    journal: str | None = None                           # the sessions' journal (sessions_journal.py)
    metrics_interval_s: float = Field(default=0.5, gt=0)
    failures_to_down: int = Field(default=2, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=16 * 2**20, gt=0)
    kv_capacity: int = Field(default=1 << 20, gt=0)      # tokens, until a server reports its own
    max_num_seqs: int = Field(default=256, gt=0)
    batch_size: int = Field(default=1024, gt=0)          # the trainer's batch: MISA-T sizes its cohorts by it
    eta: int | None = Field(default=None, ge=0, le=1000)  # staleness budget; None: the clients keep their own
    max_response_ids: int = Field(default=65536, gt=0)  # stored responses whose server the router remembers
    processes: int = Field(default=1, ge=1, le=64)       # data-path processes on the port (owner.py, helper.py)
    # who serves the port (datapath.py, rust_path.py); auto: rust where it is built and serves alone
    data_path: Literal["auto", "python", "rust"] = Field(default="auto", validate_default=True)

    @field_validator("journal")
    @classmethod
    def _journal_free(cls, v: str | None) -> str | None:
        """A journal owned by another router, or one that cannot be written, is bad input here."""
        if v is not None:
            try:
                Journal.open(v).close()
            except JournalError as exc:
                raise ValueError(str(exc).removeprefix("journal: ")) from None
        return v

    @field_validator("workers")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        out = [check_server_url(url, "--workers") for url in urls]
        if len(set(out)) != len(out):
            raise ValueError("a worker URL is listed twice")
        return out

    @field_validator("classes", mode="before")
    @classmethod
    def _shares(cls, shares: object) -> object:
        if not isinstance(shares, dict):
            return shares                   # the type's own error names it
        if not shares:
            raise ValueError("give at least one class")
        bad = [c for c, s in shares.items()
               if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < float("inf")]
        if bad:
            raise ValueError(f"share of {bad[0]!r} must be a positive number")
        return shares

    @model_validator(mode="after")
    def _names(self) -> RouterSettings:
        if self.default_class is not None and self.default_class not in self.classes:
            raise ValueError(f"default_class: {self.default_class!r} is not one of the classes")
        try:
            router_policy(self)         # built once here so that a bad name fails at start-up, naming it
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @field_validator("data_path")
    @classmethod
    def _data_path(cls, v: str, info) -> str:
        """auto: Rust where it is built and serves the port alone (one process), else Python."""
        if v != "auto":
            return v
        return "rust" if info.data.get("processes") == 1 and rust_data_path_built() else "python"

    @model_validator(mode="after")
    def _one_rust_process(self) -> RouterSettings:
        if self.data_path == "rust" and self.processes > 1:
            raise ValueError("data_path: the Rust data path serves the port alone (leave --processes at 1)")
        return self

    @property
    def target_mix(self) -> dict[str, float]:
        total = sum(self.classes.values())
        return {c: s / total for c, s in self.classes.items()}

    @property
    def fallback_class(self) -> str:
        """The class of a request that names none: the given default, else the first class."""
        return self.default_class or next(iter(self.classes))


def make_settings(**fields) -> RouterSettings:
    try:
        return RouterSettings(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc).removeprefix("scenario: ")) from None


def read_classes(path: Path) -> tuple[dict[str, float], str | None]:
    """A classes file: `{class: share, ...}`, optionally with `default: CLASS` (YAML, JSON or TOML)."""
    if not path.exists():
        raise ConfigError(f"classes: no such file {str(path)!r}")
    if not path.is_file():
        raise ConfigError(f"classes: {str(path)!r} is not a file")
    text, suffix = path.read_text(), path.suffix.lower()
    try:
        data = (tomllib.loads(text) if suffix == ".toml" else
                json.loads(text) if suffix == ".json" else yaml.safe_load(text))
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"classes: {path.name} cannot be parsed: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"classes: {path.name} must map class names to shares")
    default = data.pop("default", None)
    if default is not None and not isinstance(default, str):
        raise ConfigError("classes.default: must name a class")
    return data, default


def scenario_classes(path: Path) -> dict[str, float]:
    """The target mix of a scenario file (`--config`)."""
    try:
        scenario = load_scenario_file(path)
    except ConfigError as exc:
        raise ConfigError(f"--config {path.name}: {str(exc).removeprefix('config: ')}") from None
    return scenario.workload.target_mix()
