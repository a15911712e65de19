"""The trainer as the rollout pool sees it: it consumes batches and publishes versions.

A trajectory tagged t must be consumed by batch t + eta at the latest: batch k takes completed
trajectories oldest tag first and forms only if every older tag still fits in the batches left for
it, else the trainer waits for stragglers. Training takes a fixed time (plus an optional per-token
time), then version k+1 is published. With a mix rule (`MixRule`) a batch asks for the target mix,
waits at most `wait_s` for a short class, then fills and counts the shortfall. The rule in full:
docs/internals.md, "core/trainer".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cadencerl.core.credits import CreditModel
from cadencerl.core.mix import MixRule, compose, target_counts
from cadencerl.core.trajectory import Trajectory


@dataclass(frozen=True)
class TrainingBatch:
    """One consumed batch as data: batch `index` trains version `index` into `index + 1`.

    `trajectory_ids` are in the order the batch took them (oldest tag first, then completion order),
    so a trainer outside the controller receives exactly the trajectories that were counted."""

    index: int
    trajectory_ids: tuple[int, ...]
    substituted: int = 0    # places off the target mix: a short class's, or the staleness fallback's


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
    batch_classes: list[Counter] = field(default_factory=list)   # workload classes of each batch
    mix: MixRule | None = None        # None: batches form in completion order
    ready_since: float | None = None  # the next batch could have formed by count since then
    mix_shortfall: int = 0            # samples substituted: a class short at the bound, or the staleness fallback
    mix_short_batches: int = 0
    _wake_sent: float | None = None
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

    def _take(self, now: float) -> tuple[list[Trajectory], int] | None:
        """The trajectories of the next batch and how many places went to substitutes, or None to
        wait (too few completed, a short class within the wait bound, or a batch that would strand
        a straggler)."""
        n = min(self.batch_size, self.total - self.consumed)
        if n == 0 or self.completed_count < n:
            return None
        if self.ready_since is None:
            self.ready_since = now
        # The n oldest take the most of every tag <= t, for every t: if they strand a straggler, every
        # batch does. Checked on counts first, so waiting for stragglers costs no batch composition.
        if not self._keeps_bound(self._oldest_tags(n)):
            return None
        if self.mix is None:
            return self._oldest(n), 0
        # against the wake's own time: now - ready_since can round under wait_s at the wake
        # (119.99999999999989), and a wake that forms no batch is never sent again (a stall)
        waited = now >= self.wake_at
        picked = compose(self.completed, n, self.mix.target, self.next_batch - self.eta, fill=waited)
        if picked is None:
            return None
        batch, short = picked
        if not self._keeps_bound(Counter(t.tag for t in batch)):    # the staleness bound before the mix:
            batch = self._oldest(n)                                 # its places off the target are counted
            want = target_counts(self.mix.target, n)
            have = Counter(t.workload_class for t in batch)
            short = sum(max(0, k - have[c]) for c, k in want.items())
        if short:
            self.mix_shortfall += short
            self.mix_short_batches += 1
        return batch, short

    def _oldest(self, n: int) -> list[Trajectory]:
        """The n oldest completed trajectories, oldest tag first."""
        return [t for tag in sorted(self.completed) for t in self.completed[tag]][:n]

    def _oldest_tags(self, n: int) -> Counter:
        """How many trajectories of each tag the n oldest completed ones hold."""
        taken: Counter = Counter()
        for tag in sorted(self.completed):
            if n <= 0:
                break
            taken[tag] = min(n, len(self.completed[tag]))
            n -= taken[tag]
        return taken

    def _keeps_bound(self, taken: Counter) -> bool:
        """After a batch taking `taken` (per tag) the next one is k+1: every staleness constraint
        must still hold then."""
        return self.credits.room(min(self.credits.outstanding_by_tag), self.next_batch + 1, taken) >= 0

    @property
    def wake_at(self) -> float | None:
        """When a batch held back for a short class must be formed anyway (None: not waiting)."""
        if self.mix is None or self.ready_since is None or self.busy_until is not None:
            return None
        return self.ready_since + self.mix.wait_s

    def wake_request(self, now: float) -> float | None:
        """`wake_at` once per wait, if still ahead: the time to call `try_start` again."""
        wake = self.wake_at
        if wake is None or wake <= now or wake == self._wake_sent:
            return None
        self._wake_sent = wake
        return wake

    def try_start(self, now: float) -> float | None:
        """Start training if a batch is ready; returns the publish time."""
        if self.busy_until is not None:
            return None
        taken = self._take(now)
        if taken is None:
            return None
        return self._consume(*taken, now)

    def reform(self, ids: list[int], now: float) -> float:
        """Form the batch of exactly these completed trajectories (a restart hands out again the
        batch a dead process had formed); returns the publish time."""
        by_id = {t.id: t for ts in self.completed.values() for t in ts}
        return self._consume([by_id[i] for i in ids], 0, now)

    def _consume(self, batch: list[Trajectory], substituted: int, now: float) -> float:
        k = self.next_batch
        self.ready_since = None
        ids = {t.id for t in batch}
        for tag in {t.tag for t in batch}:
            kept = [t for t in self.completed[tag] if t.id not in ids]
            if kept:
                self.completed[tag] = kept
            else:
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
        self.batch_classes.append(Counter(t.workload_class for t in batch))
        self.batches.append(TrainingBatch(k, tuple(t.id for t in batch), substituted))
        self.busy_until = now + self.train_time_s + self.train_time_per_token_s * tokens
        return self.busy_until

    def publish(self, now: float) -> None:
        self.busy_until = None
        self.version += 1
        self.publish_times.append(now)

    @property
    def all_consumed(self) -> bool:
        return self.consumed >= self.total
