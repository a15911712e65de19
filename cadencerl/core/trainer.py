"""The trainer as the rollout pool sees it: it consumes batches and publishes versions.

A trajectory tagged t must be consumed by batch t + eta at the latest. Batch k takes completed
trajectories oldest tag first, and is formed only if afterwards, for every tag t, the trajectories
tagged <= t still unconsumed fit in the batches k+1..t+eta that remain for them. Otherwise the
trainer waits for stragglers: so no sample is ever consumed more than eta versions after the
version it started under, whatever order trajectories finish in. Training takes a fixed time (plus an optional per-token
time), then version k+1 is published.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cadencerl.core.credits import CreditModel
from cadencerl.core.trajectory import Trajectory


@dataclass(frozen=True)
class TrainingBatch:
    """One consumed batch as data: batch `index` trains version `index` into `index + 1`.

    `trajectory_ids` are in the order the batch took them (oldest tag first, then completion order),
    so a trainer outside the controller receives exactly the trajectories that were counted."""

    index: int
    trajectory_ids: tuple[int, ...]


@dataclass
class Trainer:
    credits: CreditModel
    train_time_s: float
    train_time_per_token_s: float = 0.0
    version: int = 0                 # latest published version
    busy_until: float | None = None  # training in progress until then
    consumed: int = 0
    completed: dict[int, list[Trajectory]] = field(default_factory=dict)  # by tag, in completion order
    completed_count: int = 0
    staleness: Counter = field(default_factory=Counter)
    publish_times: list[float] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)
    batch_classes: list[Counter] = field(default_factory=list)   # workload classes of each batch
    batches: list[TrainingBatch] = field(default_factory=list)   # every batch formed, in order

    @property
    def next_batch(self) -> int:
        """Index of the next batch to train; equals the version it will produce minus one."""
        return self.version + (1 if self.busy_until is not None else 0)

    @property
    def batch_size(self) -> int:
        return self.credits.batch_size

    @property
    def eta(self) -> int:
        return self.credits.eta

    @property
    def total(self) -> int:
        return self.credits.total

    def finished(self, traj: Trajectory) -> None:
        self.completed.setdefault(traj.tag, []).append(traj)
        self.completed_count += 1

    def _take(self) -> Counter | None:
        """How many of each tag the next batch takes (oldest tag first), or None if forming it
        now could strand a straggler."""
        n = min(self.batch_size, self.total - self.consumed)
        if n == 0 or self.completed_count < n:
            return None
        taken: Counter = Counter()
        for tag in sorted(self.completed):
            k = min(n, len(self.completed[tag]))
            taken[tag] = k
            n -= k
            if n == 0:
                break
        # after this batch the next one is k+1: every constraint must still hold then
        if self.credits.room(min(self.credits.outstanding_by_tag), self.next_batch + 1, taken) < 0:
            return None
        return taken

    def try_start(self, now: float) -> float | None:
        """Start training if a batch is ready; returns the publish time."""
        if self.busy_until is not None:
            return None
        taken = self._take()
        if taken is None:
            return None
        k = self.next_batch
        batch: list[Trajectory] = []
        for tag, count in taken.items():
            bucket = self.completed[tag]
            batch += bucket[:count]
            del bucket[:count]
            if not bucket:
                del self.completed[tag]
        self.completed_count -= len(batch)
        tokens = 0
        for traj in batch:
            stale = k - traj.tag
            if not 0 <= stale <= self.eta:
                raise AssertionError(f"staleness bound broken: trajectory {traj.id} tag {traj.tag} in batch {k}")
            self.staleness[stale] += 1
            self.credits.consumed(traj.tag)
            tokens += traj.tokens
        self.consumed += len(batch)
        self.batch_tokens.append(tokens)
        self.batch_classes.append(Counter(t.workload_class for t in batch))
        self.batches.append(TrainingBatch(k, tuple(t.id for t in batch)))
        self.busy_until = now + self.train_time_s + self.train_time_per_token_s * tokens
        return self.busy_until

    def publish(self, now: float) -> None:
        self.busy_until = None
        self.version += 1
        self.publish_times.append(now)

    @property
    def all_consumed(self) -> bool:
        return self.consumed >= self.total
