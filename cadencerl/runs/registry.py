"""Policy names as the command line spells them: the one place a name becomes a Policy object.

Runs take Policy objects; the faces (CLI, report, API) resolve names here. `ADMISSION+PLACEMENT`
(e.g. `misa+cache-aware`, `misa-goodput+cache-aware` with the goodput climber, or `cap4096+cache-aware`
with a rollout driver's fixed cap on sessions in flight) puts an admission layer in front of a
placement policy, and
`cache-aware-tuned` is the cache-aware router at the thresholds and weight update its sweep found
best for the scenario (it may run the sweep, see `runs/sweep.py`); an admission layer in front of
it keeps the thresholds and gets the weight update that serves it best (each system its own best).
"""

from __future__ import annotations

from collections.abc import Callable

from cadencerl.admission.misa import Admitted, MisaT
from cadencerl.admission.misa_goodput import GoodputClimb
from cadencerl.admission.session_cap import Capped, SessionCap, parse_cap
from cadencerl.config import ConfigError, Scenario
from cadencerl.core.policy import Policy
from cadencerl.policies.areal import AReaL
from cadencerl.policies.cadence import Cadence
from cadencerl.policies.dora import dora_for
from cadencerl.policies.laminar import Laminar
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.policies.routers import (VERSION_SWITCHES, CacheAware, ConsistentHash, LeastLoadedRouter, RoundRobin,
                                        StickyLeastLoaded)
from cadencerl.policies.sync import Synchronous


def _tuned_cache_aware(scenario: Scenario) -> Policy:
    from cadencerl.runs.sweep import tuned_thresholds

    router = CacheAware(**tuned_thresholds(scenario))
    router.name = "cache-aware-tuned"
    return router


def _cadence(name: str, **options: bool | str | float) -> Callable[[Scenario], Policy]:
    """CadenceRL with some of its mechanisms switched off (the ablation), under its own name."""
    return lambda s: Cadence(s.policy.model_copy(update=options), name=name)


CADENCE_ABLATIONS = {
    "cadence-no-pacing": dict(pacing=False),
    "cadence-no-concentration": dict(concentration=False),
    "cadence-no-affinity": dict(prompt_affinity=False),
    "cadence-no-kv-prep": dict(kv_preparation=False),
    "cadence-no-spread": dict(spread_when_underloaded=False),
    "cadence-whole-drain": dict(drain_whole_source=True),
    "cadence-eager-drain": dict(drain_needs_fresh_ahead=False),
    "cadence-always-concentrate": dict(concentrate_when_kv_bound=False),
    "cadence-any-bind": dict(spread_affinity="tie-break-until-kv-binds"),
    "cadence-capped-until-bound": dict(spread_affinity="capped-until-kv-binds"),
    "cadence-capped-affinity": dict(spread_affinity="capped"),
    "cadence-home-first": dict(spread_affinity="home-first"),
    "cadence-balanced-spread": dict(spread_affinity="tie-break"),
    "cadence-flat-concentrate": dict(concentrate_within_one_rank=True),
    "cadence-no-fair-share": dict(spread_fair_share=0.0),
    "cadence-any-shed-drain": dict(drain_needs_pacing_bind=False),
}

FACTORIES: dict[str, Callable[[Scenario], Policy]] = {
    "cadence": _cadence("cadence"),
    **{name: _cadence(name, **opts) for name, opts in CADENCE_ABLATIONS.items()},
    "sync": lambda s: Synchronous(overlap=False),
    "one-off": lambda s: Synchronous(overlap=True),
    "dora": dora_for,
    "laminar": lambda s: Laminar(),
    "areal": lambda s: AReaL(),
    "least-loaded": lambda s: LeastLoaded(),
    # the baselines with the prefix-aware group routing of their real deployments
    "sync-grouped": lambda s: Synchronous(overlap=False, group_affinity=True),
    "one-off-grouped": lambda s: Synchronous(overlap=True, group_affinity=True),
    "dora-grouped": lambda s: dora_for(s, group_affinity=True),
    "laminar-grouped": lambda s: Laminar(group_affinity=True),
    "areal-grouped": lambda s: AReaL(group_affinity=True),
    "least-loaded-grouped": lambda s: LeastLoaded(group_affinity=True),
    "round-robin": lambda s: RoundRobin(),
    "least-loaded-router": lambda s: LeastLoadedRouter(),
    "consistent-hash": lambda s: ConsistentHash(),
    "sticky-least-loaded": lambda s: StickyLeastLoaded(),
    "cache-aware": lambda s: CacheAware(),
    "cache-aware-tuned": _tuned_cache_aware,
}
ADMISSIONS = ("misa", "misa-goodput")   # misa-goodput: MISA-T with the goodput climber (misa_goodput.py)
# and cap<N>: a fixed cap of N sessions in flight (admission/session_cap.py)


def policy_names() -> list[str]:
    return list(FACTORIES)


def make_policy(name: str, scenario: Scenario, admission: str | None = None,
                version_switch: str | None = None) -> Policy:
    """A fresh policy (policies keep state across one run) by name, for `scenario`. `version_switch`
    fixes how `cache-aware-tuned`'s workers take new weights instead of tuning it."""
    if "+" in name:
        if admission is not None:
            raise ConfigError(f"policy: {name!r} already names an admission layer; drop --admission")
        admission, name = name.split("+", 1)
    if name not in FACTORIES:
        raise ConfigError(f"policy: unknown policy {name!r} (known: {', '.join(FACTORIES)})")
    cap = parse_cap(admission) if admission is not None else None
    if admission is not None and admission != "none" and admission not in ADMISSIONS and cap is None:
        raise ConfigError(f"admission: unknown admission layer {admission!r} "
                          f"(known: none, {', '.join(ADMISSIONS)}, cap<N> for N sessions in flight)")
    if version_switch is not None and (name != "cache-aware-tuned" or version_switch not in VERSION_SWITCHES):
        raise ConfigError(f"version_switch: {version_switch!r} is not one of {', '.join(VERSION_SWITCHES)} "
                          f"or {name} is not cache-aware-tuned")
    if admission not in ADMISSIONS and cap is None:
        policy = FACTORIES[name](scenario)
        if version_switch is not None:
            policy.version_switch = version_switch
        return policy

    def admitted(inner: Policy) -> Policy:
        if cap is not None:
            return Capped(SessionCap(cap), inner)
        climb = GoodputClimb() if admission == "misa-goodput" else None
        return Admitted(MisaT(scenario.workload.target_mix(), climb=climb), inner, label=admission)

    if name == "cache-aware-tuned":   # the tuned router's thresholds; the weight update tuned for this system
        from cadencerl.runs.sweep import tuned_version_switch

        def build(update: str) -> Policy:
            router = FACTORIES[name](scenario)
            router.version_switch = update
            return admitted(router)
        return build(version_switch or tuned_version_switch(scenario, f"{admission}+{name}", build))
    return admitted(FACTORIES[name](scenario))
