"""Scenarios: the built-in ones and the user's YAML / TOML files, one section a module."""

from cadencerl.config.cadence import CadenceSpec, DrainSpec, SpreadSpec
from cadencerl.config.fields import MAX_SECONDS, MAX_SIGMA, MAX_TOKENS, MAX_TRAJECTORIES, MAX_WORKERS
from cadencerl.config.pool import WorkerGroup
from cadencerl.config.run import ControllerSpec, TrainerSpec
from cadencerl.config.scenario import (Scenario, builtin_names, builtin_scenario, builtin_text, format_validation_error,
                                       load_scenario_dict, load_scenario_file)
from cadencerl.config.workload import ClassSpec, LengthDist, TurnSpec, WorkloadSpec
from cadencerl.user_files import ConfigError

__all__ = ["CadenceSpec", "ClassSpec", "ConfigError", "ControllerSpec", "DrainSpec", "LengthDist", "MAX_SECONDS",
           "MAX_SIGMA", "MAX_TOKENS", "MAX_TRAJECTORIES", "MAX_WORKERS", "Scenario", "SpreadSpec", "TrainerSpec",
           "TurnSpec", "WorkerGroup", "WorkloadSpec", "builtin_names", "builtin_scenario", "builtin_text",
           "format_validation_error", "load_scenario_dict", "load_scenario_file"]
