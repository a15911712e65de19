"""Policy names as the command line spells them."""

from __future__ import annotations

from collections.abc import Callable

from cadencerl.config import ConfigError, Scenario
from cadencerl.core.view import Policy
from cadencerl.policies.least_loaded import LeastLoaded

_FACTORIES: dict[str, Callable[[Scenario], Policy]] = {
    "least-loaded": lambda s: LeastLoaded(),
}


def register(name: str, factory: Callable[[Scenario], Policy]) -> None:
    _FACTORIES[name] = factory


def unregister(name: str) -> None:
    _FACTORIES.pop(name, None)


def policy_names() -> list[str]:
    _load_all()
    return list(_FACTORIES)


ADMISSIONS = ("misa",)


def make_policy(name: str, scenario: Scenario, admission: str | None = None) -> Policy:
    """A placement policy by name; `ADMISSION+PLACEMENT` (e.g. `misa+cache-aware`) or `admission`
    puts an admission layer in front of it."""
    _load_all()
    if "+" in name:
        if admission is not None:
            raise ConfigError(f"policy: {name!r} already names an admission layer; drop --admission")
        admission, name = name.split("+", 1)
    if name not in _FACTORIES:
        raise ConfigError(f"policy: unknown policy {name!r} (known: {', '.join(_FACTORIES)})")
    if admission is not None and admission != "none" and admission not in ADMISSIONS:
        raise ConfigError(f"admission: unknown admission layer {admission!r} (known: none, {', '.join(ADMISSIONS)})")
    placement = _FACTORIES[name](scenario)
    if admission == "misa":
        from cadencerl.admission.misa import Admitted, MisaT

        return Admitted(MisaT(scenario.workload.target_mix()), placement)
    return placement


def _load_all() -> None:
    """Import the policy modules so they register themselves."""
    import importlib

    for mod in ("policies.sync", "policies.laminar", "policies.areal", "policies.dora", "policies.cadence",
                "admission.registry"):
        importlib.import_module(f"cadencerl.{mod}")
