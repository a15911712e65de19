"""Router names for the command line; `cache-aware-tuned` uses the sweep's best thresholds."""

from __future__ import annotations

from cadencerl.admission.routers import CacheAware, ConsistentHash, LeastLoadedRouter, RoundRobin, StickyLeastLoaded
from cadencerl.policies.registry import register

register("round-robin", lambda s: RoundRobin())
register("least-loaded-router", lambda s: LeastLoadedRouter())
register("consistent-hash", lambda s: ConsistentHash())
register("sticky-least-loaded", lambda s: StickyLeastLoaded())
register("cache-aware", lambda s: CacheAware())


def _tuned(scenario):
    from cadencerl.admission.sweep import tuned_thresholds

    router = CacheAware(**tuned_thresholds(scenario))
    router.name = "cache-aware-tuned"
    return router


register("cache-aware-tuned", _tuned)
