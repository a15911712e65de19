"""A named CadenceRL variant: the scenario's `cadence:` section with some fields changed.

The open choices the paper leaves (docs/policies/cadence.md) are run as such files
(benchmarks/variants/*.yaml), passed where a policy name goes; the registry keeps the paper's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from cadencerl.config.cadence import CadenceSpec
from cadencerl.config.fields import SafeName, Strict
from cadencerl.config.scenario import format_validation_error, merged
from cadencerl.user_files import ConfigError, parse_scenario_file, read_text_file

SUFFIXES = (".yaml", ".yml", ".toml")


class Variant(Strict):
    label: SafeName
    description: str = Field(default="", max_length=2000)
    policy: Literal["cadence"] = "cadence"
    cadence: dict[str, Any]

    def applied(self, base: CadenceSpec) -> CadenceSpec:
        """`base` with this variant's fields merged in (a nested section field by field)."""
        try:
            return CadenceSpec.model_validate(merged(base.model_dump(), self.cadence))
        except ValidationError as exc:
            raise ConfigError(f"variant {self.label}: cadence.{format_validation_error(exc)}") from None


def is_variant_path(name: str) -> bool:
    return name.endswith(SUFFIXES)


def load_variant_file(path: str | Path) -> Variant:
    path = Path(path)
    data = parse_scenario_file(path, read_text_file(path, "policy"))
    try:
        return Variant.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"policy: {path.name}: {format_validation_error(exc)}") from None
