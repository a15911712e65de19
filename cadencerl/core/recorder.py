"""What a run records at its decisions for the plots, beside the figures: the mean resident context
of each worker every `every_s` (specialization over time) and the residency and KV share of the
traced trajectories. Ticks skipped over idle time are recorded as the decisions there would have."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.worker import Worker

Sample = tuple[float, int, float, int]                 # (t, worker, mean resident context, residents)
TracePoint = tuple[float, str | None, int, float]      # (t, accelerator or None, context, KV share)


@dataclass
class Recorder:
    every_s: float
    samples: list[Sample] = field(default_factory=list)
    traced: dict[int, list[TracePoint]] = field(default_factory=dict)   # trajectory id -> its points
    next_sample: float = 0.0

    def at_decision(self, now: float, workers: list[Worker], trajectories: dict[int, Trajectory]) -> None:
        if now >= self.next_sample:
            self.next_sample = now + self.every_s
            for w in workers:
                if w.residents:
                    self.samples.append((now, w.id, w.kv_used / len(w.residents), len(w.residents)))
        for tid, points in self.traced.items():
            t = trajectories[tid]
            if t.state is State.RESIDENT:
                w = workers[t.worker]
                points.append((now, w.accelerator, t.context, t.context / max(w.kv_used, 1)))
            elif t.state is not State.DONE and t.state is not State.FRESH:
                points.append((now, None, t.context, 0.0))

    def at_idle_ticks(self, first: float, count: int, tick: float, trajectories: dict[int, Trajectory]) -> None:
        """The `count` ticks from `first` on that were skipped, with no trajectory on any worker:
        no samples, but the sampling schedule moves on, and each traced trajectory off its worker
        gets its point at every tick."""
        last = first + (count - 1) * tick
        while count > 0 and self.next_sample <= last:
            j = max(0, math.ceil((self.next_sample - first) / tick))
            self.next_sample = first + j * tick + self.every_s
        for tid, points in self.traced.items():
            t = trajectories[tid]
            if t.state is not State.DONE and t.state is not State.FRESH:
                points.extend((first + j * tick, None, t.context, 0.0) for j in range(count))
