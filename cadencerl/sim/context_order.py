"""One engine's requests by context, longest first, kept up as they move instead of read at each
eviction: the order a policy that evicts the longest resident asks for (`Worker.longest_first`).

A request that is not decoding (in transit, waiting, prefilling) has a fixed context; every decoding
one grows by one token per step, so their order among themselves is fixed while they decode. Each
kind is one sorted list; a walk merges the two. Equal contexts come in residence order (`seq`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, Protocol

from cadencerl.core.trajectory import Trajectory


class Request(Protocol):
    """What the order reads of an engine's request (`sim/engine.py`'s Request)."""

    step0: int      # the engine step it started decoding at (-1: not decoding)
    ctx0: int       # its context then
    seq: int        # residence order
    filed: Any      # where it is filed here (None: not filed)
    traj: Trajectory


class SimEngine(Protocol):
    """What the order reads of its engine: the steps it has run."""

    steps: int
    lag: int


class ContextOrder:
    __slots__ = ("engine", "still", "growing")

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.still: list[tuple[int, int, Request]] = []     # (-context, seq, request): not decoding
        self.growing: list[tuple[int, int, Request]] = []   # (step0 - ctx0, seq, request): decoding

    def file(self, req: Request) -> None:
        """File `req` as it stands now (decoding or not), after `unfile` if it was filed."""
        if req.step0 >= 0:
            entry, into = (req.step0 - req.ctx0, req.seq, req), self.growing
        else:
            entry, into = (-req.ctx0, req.seq, req), self.still
        bisect.insort(into, entry)
        req.filed = (into, entry)

    def unfile(self, req: Request) -> None:
        """Take `req` out of the order (a no-op if it is not filed)."""
        if req.filed is not None:
            into, entry = req.filed
            del into[bisect.bisect_left(into, entry)]
            req.filed = None

    def longest_first(self) -> Iterator[Trajectory]:
        """The requests' trajectories that may leave, longest context first, equal ones in residence
        order. The walk reads the order as it stood at its first step: take them out as it goes."""
        still, growing = list(self.still), list(self.growing)
        e = self.engine
        grown = e.steps + e.lag      # every decoding request's context is ctx0 - step0 + grown
        i = j = 0
        while i < len(still) or j < len(growing):
            if j < len(growing) and (i == len(still) or _ahead(grown - growing[j][0], growing[j][1], still[i])):
                traj = growing[j][2].traj
                j += 1
            else:
                traj = still[i][2].traj
                i += 1
            if traj.resumable:
                yield traj


def _ahead(context: int, seq: int, other: tuple[int, int, Request]) -> bool:
    """Does a decoding request of `context` and `seq` come before the still one `other`?"""
    return context > -other[0] or (context == -other[0] and seq < other[1])
