"""The admission budget eta: how far fresh work may run ahead of training consumption.

A trajectory tagged v may be consumed by batches v..v+eta at the latest, so fresh work is admitted
under version v only while (a) batch v+eta has not been formed yet and (b) everything tagged <= v
fits in batches 0..v+eta: count(tag <= v) <= (v + eta + 1) * batch_size. This is AReaL's
`(max_staleness + version + 1) * batch - (accepted + running)` bound, per version. In steady state
it keeps about (eta+1) batches in flight; eta = 0 is synchronous, eta = 1 one-step off-policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CreditModel:
    batch_size: int
    eta: int
    total: int
    admitted_by_tag: dict[int, int] = field(default_factory=dict)

    @property
    def admitted(self) -> int:
        return sum(self.admitted_by_tag.values())

    def admitted_up_to(self, version: int) -> int:
        return sum(n for v, n in self.admitted_by_tag.items() if v <= version)

    def admissible(self, version: int, next_batch: int) -> int:
        """How many more fresh trajectories may start under `version` now."""
        if version + self.eta < next_batch:
            return 0
        room = (version + self.eta + 1) * self.batch_size - self.admitted_up_to(version)
        return max(0, min(room, self.total - self.admitted))

    def record(self, version: int, n: int = 1) -> None:
        self.admitted_by_tag[version] = self.admitted_by_tag.get(version, 0) + n
