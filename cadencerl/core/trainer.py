"""The trainer as the rollout pool sees it: it consumes batches and publishes versions.

Batch k may be formed only when every trajectory tagged <= k - eta has completed, and it takes
completed trajectories oldest tag first, so no sample is ever consumed more than eta versions
after the version it started under. Training takes a fixed time (plus an optional per-token
time), then version k+1 is published.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cadencerl.core.trajectory import Trajectory


@dataclass
class Trainer:
    batch_size: int
    eta: int
    total: int
    train_time_s: float
    train_time_per_token_s: float = 0.0
    version: int = 0                 # latest published version
    busy_until: float | None = None  # training in progress until then
    consumed: int = 0
    completed: list[Trajectory] = field(default_factory=list)
    unfinished_by_tag: Counter = field(default_factory=Counter)
    staleness: Counter = field(default_factory=Counter)
    publish_times: list[float] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)

    @property
    def next_batch(self) -> int:
        """Index of the next batch to train; equals the version it will produce minus one."""
        return self.version + (1 if self.busy_until is not None else 0)

    def started(self, traj: Trajectory) -> None:
        self.unfinished_by_tag[traj.tag] += 1

    def finished(self, traj: Trajectory) -> None:
        self.unfinished_by_tag[traj.tag] -= 1
        if not self.unfinished_by_tag[traj.tag]:
            del self.unfinished_by_tag[traj.tag]
        self.completed.append(traj)

    def _batch_ready(self) -> bool:
        k = self.next_batch
        oldest_unfinished = min(self.unfinished_by_tag, default=None)
        if oldest_unfinished is not None and oldest_unfinished <= k - self.eta:
            return False  # a straggler must make it into this batch
        remaining = self.total - self.consumed
        return len(self.completed) >= min(self.batch_size, remaining) > 0

    def try_start(self, now: float) -> float | None:
        """Start training if a batch is ready; returns the publish time."""
        if self.busy_until is not None or not self._batch_ready():
            return None
        k = self.next_batch
        self.completed.sort(key=lambda t: (t.tag, t.completed_at))
        n = min(self.batch_size, len(self.completed))
        batch, self.completed = self.completed[:n], self.completed[n:]
        tokens = 0
        for traj in batch:
            stale = k - traj.tag
            if stale > self.eta or stale < 0:
                raise AssertionError(f"staleness bound broken: trajectory {traj.id} tag {traj.tag} in batch {k}")
            self.staleness[stale] += 1
            tokens += traj.tokens
        self.consumed += n
        self.batch_tokens.append(tokens)
        self.busy_until = now + self.train_time_s + self.train_time_per_token_s * tokens
        return self.busy_until

    def publish(self, now: float) -> None:
        self.busy_until = None
        self.version += 1
        self.publish_times.append(now)

    @property
    def all_consumed(self) -> bool:
        return self.consumed >= self.total
