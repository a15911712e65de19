"""The admission budget eta: how far fresh work may run ahead of training consumption.

A trajectory tagged v must be consumed by batch v + eta at the latest. With k the next batch to
be formed, the trajectories tagged <= t that are started but not consumed must fit in batches
k..t+eta, for every tag t:  outstanding(<= t) <= (t + eta - k + 1) * batch_size.
Fresh work under version v raises outstanding(<= t) for every t >= v, so it is admitted only while
all those inequalities keep room. With every batch consumed in tag order this is exactly AReaL's
`(max_staleness + version + 1) * batch - (accepted + running)`; it stays safe when trajectories
finish out of order. In steady state about (eta+1) batches are in flight; eta = 0 is synchronous.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class CreditModel:
    """The books change only through `record` and `consumed`: `admissible` remembers its last
    answer, which those two keep exact (the controller asks before every admission)."""

    batch_size: int
    eta: int
    total: int
    admitted: int = 0
    outstanding_by_tag: Counter = field(default_factory=Counter)   # started, not yet consumed
    _last: tuple[int, int, int] | None = field(default=None, repr=False)  # (version, next batch, admissible)

    def room(self, tag: int, next_batch: int, extra: dict[int, int] | None = None) -> int:
        """Slack of the tightest constraint for tags >= `tag`, after removing `extra` (a batch being formed)."""
        out, b = self.outstanding_by_tag, self.batch_size
        base = self.eta - next_batch + 1
        left = 0
        slack = None
        for t in sorted(out):
            if t > tag and slack is None:  # the constraint at `tag` itself
                slack = (tag + base) * b - left
            left += out[t] - (extra.get(t, 0) if extra else 0)
            if t >= tag:
                s = (t + base) * b - left
                slack = s if slack is None or s < slack else slack
        return (tag + base) * b - left if slack is None else slack

    def admissible(self, version: int, next_batch: int) -> int:
        """How many more fresh trajectories may start under `version` now."""
        last = self._last
        if last is not None and last[0] == version and last[1] == next_batch:
            return last[2]
        n = max(0, min(self.room(version, next_batch), self.total - self.admitted))
        self._last = (version, next_batch, n)
        return n

    def record(self, version: int, n: int = 1) -> None:
        self.admitted += n
        self.outstanding_by_tag[version] += n
        # Every constraint at or above `version` lost n, and so did the total: what a version at or
        # above it may admit fell by exactly n. Below it, some constraints did not move: asked anew.
        last = self._last
        self._last = (last[0], last[1], max(0, last[2] - n)) if last is not None and last[0] >= version else None

    def consumed(self, tag: int) -> None:
        self.outstanding_by_tag[tag] -= 1
        if not self.outstanding_by_tag[tag]:
            del self.outstanding_by_tag[tag]
        self._last = None
