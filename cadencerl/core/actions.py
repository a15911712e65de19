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


Action = Admit | Evict | Place | Advance | Interrupt


class ActionError(ValueError):
    """A policy asked for something the controller must refuse (a policy bug, never user input)."""
