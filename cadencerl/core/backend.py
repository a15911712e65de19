"""The seam between the controller and whatever runs the tokens: a simulator or real engines."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker


class Restore(Enum):
    """How a trajectory's context gets onto its destination's KV cache."""

    PREFILL = "prefill"          # token transfer + prefill on the destination, less its prefix-cache hits
    CACHED = "cached"            # already computed on this engine (after a prefill, or loaded KV)
    KV_TRANSFER = "kv-transfer"  # prepared KV loaded over the cluster link (no recompute)


@dataclass(frozen=True, slots=True)
class Finished:
    traj: Trajectory
    time: float


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """A multi-turn trajectory finished a reply and now waits on a tool (it left its worker)."""

    traj: Trajectory
    time: float


@dataclass(frozen=True, slots=True)
class ToolReturned:
    traj: Trajectory
    time: float
    observation_tokens: int


@dataclass(frozen=True, slots=True)
class Timer:
    time: float
    tag: str


@dataclass(frozen=True, slots=True)
class Published:
    """The trainer finished a step: a new policy version exists from `time` on."""

    time: float


@dataclass(frozen=True, slots=True)
class WorkerLost:
    worker: int
    time: float
    why: str = ""                # what the backend saw (refused, unhealthy, no answer, ...)


Event = Finished | TurnEnded | ToolReturned | Timer | Published | WorkerLost


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What an engine reports about itself (vLLM's /metrics)."""

    kv_tokens: int
    running: int
    waiting: int
    preemptions: int


@runtime_checkable
class PrefixCounts(Protocol):
    """An engine's prefix cache over a run, counted as vLLM counts it: tokens hit of tokens queried."""

    hits: int
    queried: int


@runtime_checkable
class EngineFigures(Protocol):
    """One engine's totals over a run, the per-engine input of a run's summary. The simulator's
    engines and the real backend's worker records both provide it."""

    tokens_generated: int
    preemptions: int
    prefill_tokens: int
    preemptions_by_class: dict[str, int]   # empty where the engine cannot tell (a real server)
    cache: PrefixCounts


class Backend(Protocol):
    """Turns placements into work and reports what happened; owns the clock."""

    def now(self) -> float: ...

    def start(self, workers: list[Worker]) -> None: ...

    def refresh(self, workers: list[Worker], now: float) -> None:
        """Bring every observation (token counts, KV use) up to `now` and write each live worker's
        figures: `kv_used` (KV its residents hold or reserve), and what its engine reports
        (`engine_kv`, `num_waiting`, `preemptions`). Before every decision."""

    def place(self, traj: Trajectory, worker: int, restore: Restore, delay_s: float) -> None: ...

    def evict(self, traj: Trajectory) -> None:
        """Abort; afterwards `traj.tokens` holds every token it generated."""

    def set_version(self, worker: int, version: int, keep_kv: bool = False) -> None:
        """The worker takes new weights: empty or just aborted, or (`keep_kv`) with its requests
        frozen and resumed on the KV they hold."""

    def commit(self, now: float) -> None:
        """End of a decision: let the engines act on the changes."""

    def schedule(self, time: float, tag: str) -> None:
        """Report `Timer(time, tag)` at `time`."""

    def publish_at(self, time: float) -> None:
        """The trainer's step that publishes the next version ends at `time` (the simulated trainer's
        reckoning): report `Published` once the version exists (a real trainer may say when)."""

    def advance(self, until: float) -> list[Event]:
        """Run until `until` or the first timer, whichever is first; return what happened."""

    def idle(self) -> bool:
        """Nothing is running or scheduled: time would not move without a new placement."""

    def next_event_time(self) -> float | None:
        """The earliest time something is scheduled to happen, if the backend keeps a virtual clock
        that may jump there (None: it does not, or nothing is scheduled)."""

    def verify(self) -> list[str]:
        """Conservation problems found by the engine side (empty when all is well)."""


def refresh_each(backend, workers: list[Worker]) -> None:
    """`refresh` for a backend whose observations are live (nothing to bring up to date): each live
    worker's figures from its `kv_committed(worker)` and `stats(worker)`."""
    for w in workers:
        if w.alive:
            w.kv_used = backend.kv_committed(w.id)
            st = backend.stats(w.id)
            w.engine_kv, w.num_waiting, w.preemptions = st.kv_tokens, st.waiting, st.preemptions
