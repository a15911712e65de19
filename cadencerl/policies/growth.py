"""How fast a worker's residents grow, observed between decisions: the part of CadenceRL's floor
that lets pacing evict before the engine would have to preempt. O(1) per worker asked about."""

from __future__ import annotations

from collections.abc import Mapping

from cadencerl.core.trajectory import Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker


class GrowthMeter:
    """KV tokens a worker's residents will add before the next decision.

    Every decoding resident of a worker grows by one token per engine step, so one resident's
    observed growth between two decisions gives the worker's per-resident rate. The probe is the
    worker's longest-placed resident (most likely running, not queued). The estimate rises at once
    and decays by halves, so a worker speeding up is covered from its first observation.
    """

    def __init__(self, horizon_s: float, window_s: float = 0.0) -> None:
        self.horizon_s = horizon_s
        self.window_s = window_s        # shortest span a measurement covers (CadenceSpec.growth_window_s)
        self._probe: dict[int, tuple[Trajectory, int, float]] = {}   # worker -> (trajectory, context, time)
        self._rate: dict[int, float] = {}                      # worker -> tokens per second per resident

    def observe(self, view: PoolView) -> None:
        now, probes, rates = view.now, self._probe, self._rate
        for w in view.workers:
            wid, residents = w.id, w.residents
            probe = probes.get(wid)
            traj = None
            if probe is not None:
                traj, ctx, t = probe
                if traj.worker == wid and now > t:   # still resident here
                    if now - t < self.window_s:
                        continue                     # too short a span yet: the probe keeps its start
                    context = traj.context
                    rate = (context - ctx) / (now - t)
                    old = rates.get(wid, 0.0)
                    rates[wid] = rate if rate >= old else 0.5 * (old + rate)
                else:
                    traj = None
            if residents and w.alive:
                first = next(iter(residents.values()))
                probes[wid] = (first, context if first is traj else first.context, now)
            elif probe is not None:
                del probes[wid]

    def tokens(self, w: Worker, residents: int) -> int:
        """Growth of `residents` decoding sequences on `w` over the horizon."""
        return int(residents * self._rate.get(w.id, 0.0) * self.horizon_s)

    def per_resident(self, w: Worker) -> float:
        """Growth of one decoding sequence on `w` over the horizon."""
        return self._rate.get(w.id, 0.0) * self.horizon_s

    @property
    def rates(self) -> Mapping[int, float]:
        """Worker id -> tokens per second per resident, for the workers observed so far (read only)."""
        return self._rate
