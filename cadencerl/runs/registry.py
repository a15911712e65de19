"""Policy names as the command line spells them: the one place a name becomes a Policy object.

The registry holds the papers' policies, the baselines and the paper's four ablations. Also:
`ADMISSION+PLACEMENT` (`misa+cache-aware`, `misa-goodput+...`, `cap<N>+...`) puts an admission layer
in front of a placement policy; a path to a variant file (benchmarks/variants/*.yaml) is CadenceRL
with its `cadence:` section changed; `grouped=True` gives a baseline prefix-aware group routing.
`cache-aware-tuned` is the cache-aware router at its sweep's best setting (runs/sweep.py).
"""

from __future__ import annotations

from collections.abc import Callable

from cadencerl.admission.misa import Admitted, MisaT
from cadencerl.admission.misa_goodput import GoodputClimb
from cadencerl.admission.session_cap import Capped, SessionCap, parse_cap
from cadencerl.config import ConfigError, Scenario
from cadencerl.config.variant import is_variant_path, load_variant_file
from cadencerl.core.policy import Policy
from cadencerl.policies.areal import AReaL
from cadencerl.policies.cadence import Cadence
from cadencerl.policies.dora import dora_for
from cadencerl.policies.laminar import Laminar
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.policies.routers import (VERSION_SWITCHES, CacheAware, ConsistentHash, LeastLoadedRouter, RoundRobin,
                                        StickyLeastLoaded)
from cadencerl.policies.sync import Synchronous
from cadencerl.runs.assemble import decode_rate


def _tuned_cache_aware(scenario: Scenario) -> Policy:
    from cadencerl.runs.sweep import tuned_thresholds

    router = CacheAware(**tuned_thresholds(scenario))
    router.name = "cache-aware-tuned"
    return router


def _cadence(name: str, **mechanism: bool) -> Callable[[Scenario], Policy]:
    """CadenceRL, or one of the paper's ablations: one mechanism switched off, under its own name."""
    return lambda s: Cadence(s.cadence.model_copy(update=mechanism), s.controller.tick_s, name=name,
                             decode_rate=decode_rate(s))


CADENCE_ABLATIONS = {
    "cadence-no-pacing": dict(pacing=False),
    "cadence-no-concentration": dict(concentration=False),
    "cadence-no-affinity": dict(prompt_affinity=False),
    "cadence-no-kv-prep": dict(kv_preparation=False),
}

# The baselines that also run with the prefix-aware group routing of their real deployments.
GROUPABLE: dict[str, Callable[[Scenario, bool], Policy]] = {
    "sync": lambda s, g: Synchronous(overlap=False, group_affinity=g),
    "one-off": lambda s, g: Synchronous(overlap=True, group_affinity=g),
    "dora": lambda s, g: dora_for(s, group_affinity=g),
    "laminar": lambda s, g: Laminar(group_affinity=g),
    "areal": lambda s, g: AReaL(group_affinity=g),
    "least-loaded": lambda s, g: LeastLoaded(group_affinity=g),
}

FACTORIES: dict[str, Callable[[Scenario], Policy]] = {
    "cadence": _cadence("cadence"),
    **{name: _cadence(name, **off) for name, off in CADENCE_ABLATIONS.items()},
    **{name: (lambda make: lambda s: make(s, False))(make) for name, make in GROUPABLE.items()},
    "round-robin": lambda s: RoundRobin(),
    "least-loaded-router": lambda s: LeastLoadedRouter(),
    "consistent-hash": lambda s: ConsistentHash(),
    "sticky-least-loaded": lambda s: StickyLeastLoaded(),
    "cache-aware": lambda s: CacheAware(),
    "cache-aware-tuned": _tuned_cache_aware,
}
ADMISSIONS = ("misa", "misa-goodput")   # misa-goodput: MISA-T with the goodput climber (misa_goodput.py)
# and cap<N>: a fixed cap of N sessions in flight (admission/session_cap.py)

VARIANT_NAMES = ("no-spread", "whole-drain", "eager-drain", "always-concentrate", "any-bind", "capped-until-bound",
                 "capped-affinity", "home-first", "balanced-spread", "flat-concentrate", "no-fair-share",
                 "any-shed-drain")
RETIRED = {f"cadence-{v}": f"is a variant file now: pass benchmarks/variants/cadence-{v}.yaml" for v in VARIANT_NAMES}
RETIRED |= {f"{b}-grouped": f"is {b!r} with grouped routing now (--grouped; grouped=True in make_policy)"
            for b in GROUPABLE}


def grouped_label(label: str) -> tuple[str, bool]:
    """A result's label as (name, grouped): a grouped baseline's runs are labelled NAME-grouped."""
    base = label.removesuffix("-grouped")
    return (base, True) if base != label and base in GROUPABLE else (label, False)


def policy_names() -> list[str]:
    return list(FACTORIES)


def live_scenario(s: Scenario) -> Scenario:
    """The scenario as live servers run it (the router; `run` on vLLM servers): their tokens are
    counted as reads bring them, in bursts, so CadenceRL measures growth over at least a tick
    (`growth_window_s`), unless the scenario sets it."""
    if s.cadence.growth_window_s is not None:
        return s
    return s.with_overrides(cadence={"growth_window_s": s.controller.tick_s})


def make_policy(name: str, scenario: Scenario, admission: str | None = None,
                version_switch: str | None = None, grouped: bool = False,
                target_mix: dict[str, float] | None = None, cache_aware: dict | None = None) -> Policy:
    """A fresh policy (policies keep state across one run) by name, for `scenario`. `version_switch`
    fixes how `cache-aware-tuned`'s workers take new weights instead of tuning it; `grouped` gives
    a baseline of GROUPABLE the prefix-aware group routing of its real deployments. A live router
    gives its own `target_mix` (its classes) and `cache_aware`'s thresholds (its vllm-router flags)."""
    if "+" in name:
        if admission is not None:
            raise ConfigError(f"policy: {name!r} already names an admission layer; drop --admission")
        admission, name = name.split("+", 1)
    cap = parse_cap(admission) if admission is not None else None
    if admission is not None and admission != "none" and admission not in ADMISSIONS and cap is None:
        raise ConfigError(f"admission: unknown admission layer {admission!r} "
                          f"(known: none, {', '.join(ADMISSIONS)}, cap<N> for N sessions in flight)")
    if version_switch is not None and (name != "cache-aware-tuned" or version_switch not in VERSION_SWITCHES):
        raise ConfigError(f"version_switch: {version_switch!r} is not one of {', '.join(VERSION_SWITCHES)} "
                          f"or {name} is not cache-aware-tuned")
    if admission not in ADMISSIONS and cap is None:
        policy = _placement(name, scenario, grouped, cache_aware)
        if version_switch is not None:
            policy.version_switch = version_switch
        return policy

    def admitted(inner: Policy) -> Policy:
        if cap is not None:
            return Capped(SessionCap(cap), inner)
        climb = GoodputClimb() if admission == "misa-goodput" else None
        return Admitted(MisaT(target_mix or scenario.workload.target_mix(), climb=climb), inner, label=admission)

    if name == "cache-aware-tuned":   # the tuned router's thresholds; the version switch tuned for this system
        from cadencerl.runs.sweep import tuned_version_switch

        def build(update: str) -> Policy:
            router = FACTORIES[name](scenario)
            router.version_switch = update
            return admitted(router)
        return build(version_switch or tuned_version_switch(scenario, f"{admission}+{name}", build))
    return admitted(_placement(name, scenario, grouped, cache_aware))


def _placement(name: str, scenario: Scenario, grouped: bool, cache_aware: dict | None = None) -> Policy:
    """The placement policy `name` names: a registered one, or a CadenceRL variant file."""
    if is_variant_path(name):
        variant = load_variant_file(name)
        return Cadence(variant.applied(scenario.cadence), scenario.controller.tick_s, name=variant.label,
                       decode_rate=decode_rate(scenario))
    if name in RETIRED:
        raise ConfigError(f"policy: {name!r} {RETIRED[name]}")
    if name not in FACTORIES:
        raise ConfigError(f"policy: unknown policy {name!r} (known: {', '.join(FACTORIES)}, or a variant file "
                          "such as benchmarks/variants/cadence-home-first.yaml)")
    if not grouped:
        if cache_aware is not None and name == "cache-aware":
            return CacheAware(**cache_aware)
        return FACTORIES[name](scenario)
    if name not in GROUPABLE:
        raise ConfigError(f"grouped: {name} has no grouped routing (the baselines that do: {', '.join(GROUPABLE)})")
    return GROUPABLE[name](scenario, True)
