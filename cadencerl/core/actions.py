"""What a policy may ask for. The controller validates each against capacity, staleness and state."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Admit:
    """Start fresh trajectory `traj` on `worker`, tagged with the worker's version."""

    worker: int
    traj: int


@dataclass(frozen=True, slots=True)
class Evict:
    """Depart a resident trajectory to the pending set of its version."""

    traj: int


@dataclass(frozen=True, slots=True)
class Place:
    """Send a pending trajectory to a worker of its version."""

    traj: int
    worker: int


@dataclass(frozen=True, slots=True)
class Advance:
    """Move an empty worker to a newer policy version (a weight update)."""

    worker: int
    version: int


@dataclass(frozen=True, slots=True)
class Interrupt:
    """AReaL-style: abort a worker's residents, update its weights, resume them there (re-prefill)."""

    worker: int
    version: int


@dataclass(frozen=True, slots=True)
class UpdateInPlace:
    """vLLM's `/pause?mode=keep`: freeze a worker's requests, update its weights, resume them with the
    KV they hold (OpenRLHF's partial rollout, PipelineRL's in-flight updates): no re-prefill."""

    worker: int
    version: int


@dataclass(frozen=True, slots=True)
class Batch:
    """Admissions and placements applied in order as one: `trajs[i]` goes to `workers[i]`, admitted
    fresh where `admits[i]`, else placed from the pending set. The controller validates the lot
    (each trajectory, each worker's KV, the eta budget of the one version the admissions start
    under) before any of it happens. A policy that books its own placements (it never reads a
    worker back within the batch) proposes a decision's stream this way; kept as columns, since
    a decision may hold a hundred of them."""

    trajs: tuple[int, ...]
    workers: tuple[int, ...]
    admits: tuple[bool, ...]

    @property
    def actions(self) -> tuple[Admit | Place, ...]:
        """The same, one action each."""
        return tuple(Admit(w, t) if a else Place(t, w) for t, w, a in zip(self.trajs, self.workers, self.admits))


Action = Admit | Evict | Place | Advance | Interrupt | UpdateInPlace | Batch


class ActionError(ValueError):
    """A policy asked for something the controller must refuse (a policy bug, never user input)."""
