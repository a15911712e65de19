"""Weight synchronization: what a version update costs a worker, under its policy's overlap.

A new version crosses to each cluster once over the trainer's egress, then each worker loads it over
its own NICs. The policy's style decides when the cluster copy starts: "on-demand" (when the first
worker of the cluster takes the version) or "prefetch" (at publish). A worker whose weights have not
arrived runs nothing. Which policy uses which: docs/internals.md, "sim/weights".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadencerl.hardware.catalog import LINKS
from cadencerl.sim.links import Links

STYLES = ("on-demand", "prefetch")


@dataclass
class WeightSync:
    weight_bytes: float
    clusters: list[str]            # by worker id
    tps: list[int]                 # by worker id
    trainer_cluster: str | None    # None: the trainer has a cluster of its own
    style: str
    links: Links
    published: int = 0
    copies: dict[tuple[str, int], float] = field(default_factory=dict)   # (cluster, version) -> arrival
    waited_s: float = 0.0          # summed over workers: time from taking a version to running with it
    updates: int = 0

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"weight_sync: unknown style {self.style!r} (known: {', '.join(STYLES)})")

    def publish(self, now: float) -> None:
        self.published += 1
        if self.style == "prefetch":
            for c in sorted(set(self.clusters)):
                self._copy(c, self.published, now)

    def ready_at(self, worker: int, version: int, now: float) -> float:
        """When `worker`, taking `version` at `now`, can run with it."""
        if self.weight_bytes <= 0:
            return now
        arrived = self._copy(self.clusters[worker], version, now)
        nic = self.links.get(f"nic-in:{worker}", LINKS["intra-cluster"], self.tps[worker],
                             report=f"intra-cluster:{self.clusters[worker]}")
        ready = nic.send(max(now, arrived), self.weight_bytes)
        self.waited_s += ready - now
        self.updates += 1
        return ready

    def _copy(self, cluster: str, version: int, now: float) -> float:
        key = (cluster, version)
        if key not in self.copies:
            if cluster == self.trainer_cluster:
                self.copies[key] = now
            else:
                egress = self.links.get("trainer-egress", LINKS["cross-cluster"], report="cross-cluster")
                self.copies[key] = egress.send(now, self.weight_bytes)
        return self.copies[key]
