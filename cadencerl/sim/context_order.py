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
    filed: Any      # the list it is filed in (None: not filed)
    key: int        # its key there
    traj: Trajectory


class SimEngine(Protocol):
    """What the order reads of its engine: the steps it has run."""

    steps: int
    lag: int


_SEQ = 1 << 40           # a request's key: its context part times _SEQ plus its seq (below 2**40)
_SEQ_MASK = _SEQ - 1


class ContextOrder:
    """Each list holds int keys (one int compares faster than a tuple, and a bisection compares
    about twenty): a still request's is -context * _SEQ + seq, a decoding one's (step0 - ctx0) *
    _SEQ + seq. Both ascend longest first, and a decoding key less `grown * _SEQ` is the still key
    of its context now, so a walk is a merge of two sorted lists."""

    __slots__ = ("engine", "still", "growing", "by_seq")

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.still: list[int] = []       # keys of the requests not decoding
        self.growing: list[int] = []     # keys of the decoding ones
        self.by_seq: dict[int, Request] = {}   # every filed request by its seq

    def file(self, req: Request) -> None:
        """File `req` as it stands now (decoding or not), after `unfile` if it was filed."""
        if req.step0 >= 0:
            key, into = (req.step0 - req.ctx0) * _SEQ + req.seq, self.growing
        else:
            key, into = -req.ctx0 * _SEQ + req.seq, self.still
        bisect.insort(into, key)
        self.by_seq[req.seq] = req
        req.filed, req.key = into, key

    def unfile(self, req: Request) -> None:
        """Take `req` out of the order (a no-op if it is not filed)."""
        into = req.filed
        if into is not None:
            del into[bisect.bisect_left(into, req.key)]
            del self.by_seq[req.seq]
            req.filed = None

    def longest_first(self) -> Iterator[Trajectory]:
        """The requests' trajectories that may leave, longest context first, equal ones in residence
        order. The walk reads the order as it stood at its first step: take them out as it goes."""
        still, growing, by_seq = list(self.still), list(self.growing), self.by_seq
        e = self.engine
        shift = (e.steps + e.lag) * _SEQ     # every decoding request's context is ctx0 - step0 + grown
        i = j = 0
        while i < len(still) or j < len(growing):
            if j < len(growing) and (i == len(still) or growing[j] - shift < still[i]):
                key = growing[j]
                j += 1
            else:
                key = still[i]
                i += 1
            traj = by_seq[key & _SEQ_MASK].traj
            if traj.resumable:
                yield traj
