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


def policy_names() -> list[str]:
    _load_all()
    return list(_FACTORIES)


def make_policy(name: str, scenario: Scenario) -> Policy:
    _load_all()
    if name not in _FACTORIES:
        raise ConfigError(f"policy: unknown policy {name!r} (known: {', '.join(_FACTORIES)})")
    return _FACTORIES[name](scenario)


def _load_all() -> None:
    """Import the policy modules so they register themselves."""
    import importlib

    for mod in ("sync", "laminar", "areal", "dora", "cadence"):
        try:
            importlib.import_module(f"cadencerl.policies.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"cadencerl.policies.{mod}":
                raise
