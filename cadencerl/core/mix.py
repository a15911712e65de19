"""Which completed trajectories a batch takes when the trainer asks for a workload mixture.

The rule (the trainer's side of mixture fidelity; documented in trainer.py):
1. Every completed trajectory whose staleness deadline is this batch (tag <= due) goes in: the
   staleness bound comes before the mixture.
2. Each class then gets up to its target count, largest-remainder rounding of m_c x n, oldest tag
   first and in completion order within a tag.
3. A class that has fewer completed than its target is *short*. Without `fill` the batch is not
   formed (the trainer waits). With `fill` (the wait bound passed) the missing places go to the
   other classes' oldest completions, and how many were substituted is returned as the shortfall.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cadencerl.core.trajectory import Trajectory


@dataclass(frozen=True)
class MixRule:
    """What the trainer asks each batch for: the target class mix, and how long it waits for a
    short class before it takes what is there."""

    target: dict[str, float]
    wait_s: float = 0.0

    @staticmethod
    def maybe(target: dict[str, float] | None, wait_s: float) -> "MixRule | None":
        return MixRule(target, wait_s) if target is not None else None


def target_counts(mix: dict[str, float], n: int) -> dict[str, int]:
    """m_c x n rounded so the counts sum to n (largest remainder, ties by class name)."""
    if len(mix) == 1:                       # one class with a share takes all n (the rule's answer,
        (cls, share), = mix.items()         # without building its key: MISA-T asks on every admission)
        if share > 0:
            return {cls: n}
    return dict(_target_counts(tuple(mix.items()), n))


@lru_cache(maxsize=4096)
def _target_counts(mix: tuple[tuple[str, float], ...], n: int) -> tuple[tuple[str, int], ...]:
    """`target_counts`, kept: MISA-T asks it for the same mix and size on most of a router's events."""
    total = sum(m for _, m in mix) or 1.0
    exact = {c: n * m / total for c, m in mix}
    counts = {c: int(x) for c, x in exact.items()}
    left = n - sum(counts.values())
    for c in sorted(exact, key=lambda c: (counts[c] - exact[c], c))[:left]:
        counts[c] += 1
    return tuple(counts.items())


def compose(completed: dict[int, list[Trajectory]], n: int, mix: dict[str, float], due: int,
            fill: bool) -> tuple[list[Trajectory], int] | None:
    """The `n` trajectories of the next batch and the shortfall, or None if a class is short and
    `fill` is off. `completed` maps tag -> trajectories in completion order (not modified)."""
    ordered = [t for tag in sorted(completed) for t in completed[tag]]
    forced = [t for t in ordered if t.tag <= due]
    want = target_counts(mix, n)
    for t in forced:
        want[t.workload_class] = want.get(t.workload_class, 0) - 1
    chosen = {t.id for t in forced}
    batch = list(forced)
    for t in ordered:
        if len(batch) >= n:
            break
        if t.id not in chosen and want.get(t.workload_class, 0) > 0:
            want[t.workload_class] -= 1
            chosen.add(t.id)
            batch.append(t)
    short = n - len(batch)
    if short > 0 and not fill:
        return None
    for t in ordered:
        if len(batch) >= n:
            break
        if t.id not in chosen:
            chosen.add(t.id)
            batch.append(t)
    return batch[:n], max(0, short)
