"""Request routers, as the serving routers run them (see reference/routers.md).

A router places every request (a first turn or a continuation) on a worker as it arrives and never
moves it; the engine queues what it cannot run yet, and load is the router's own in-flight count.
Here: `round-robin`, `least-loaded-router`, `consistent-hash`, `sticky-least-loaded` and `cache-aware`
(vLLM Router / SGLang router), plus how a router's workers take new weights (`version_switch`:
`when-idle`, `interrupt`, `in-place`), the rollout system's choice the simulator models here. Each
rule, and why `cache-aware-tuned` is tuned over all three: docs/baselines.md.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterator

from mypy_extensions import mypyc_attr

from cadencerl.config import ConfigError
from cadencerl.core.actions import Action, Admit, Place
from cadencerl.core.policy import Policy
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.base import Rotation, advance_idle, interrupt_behind, update_behind_in_place
from cadencerl.policies.prefix_tree import PrefixTree

VERSION_SWITCHES = {"when-idle": advance_idle, "interrupt": interrupt_behind, "in-place": update_behind_in_place}


@mypyc_attr(allow_interpreted_subclasses=True)
class Router(Policy):
    """The routing loop shared by every router: continuations first, then new sessions. A pinned
    trajectory (`Trajectory.pin`) goes to its worker or waits: no other worker can serve it; an
    admission layer's caps do not hold it (`PoolView.accepts_new`), its class gate still may."""

    name = "router"
    kv_transfer = False
    queues_at_engine = True
    version_switch = "when-idle"     # a key of VERSION_SWITCHES

    @property
    def updates_in_place(self) -> bool:
        return self.version_switch == "in-place"

    def route(self, view: PoolView, traj: Trajectory, workers: list[Worker]) -> Worker:
        raise NotImplementedError

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from VERSION_SWITCHES[self.version_switch](view)
        by_version: dict[int, list[Worker]] = {}
        for w in view.alive():
            by_version.setdefault(w.version, []).append(w)
        for v in view.pending.versions():
            workers = by_version.get(v, [])
            if not workers:
                continue
            for traj in sorted(view.pending.at(v), key=lambda t: (t.departed_at, t.id)):
                ok = [w for w in _serving(traj, workers) if traj.context < w.kv_capacity]
                if ok:
                    yield Place(traj.id, self.route(view, traj, ok).id)
        while (nxt := view.next_fresh()) is not None:
            ok = view.may_start_on([w for w in _serving(nxt, view.alive()) if nxt.context < w.kv_capacity], nxt)
            if not ok:
                return
            yield Admit(self.route(view, nxt, ok).id, nxt.id)


def _serving(traj: Trajectory, workers: list[Worker]) -> list[Worker]:
    """The workers `traj` may run on: all of them, or the one it is pinned to (which holds its state)."""
    return workers if traj.pin is None else [w for w in workers if w.id == traj.pin]


def _least_loaded(workers: list[Worker]) -> Worker:
    return min(workers, key=lambda w: (w.load, w.id))


@mypyc_attr(allow_interpreted_subclasses=True)
class RoundRobin(Router):
    name = "round-robin"

    def __init__(self) -> None:
        self._rotation = Rotation()

    def route(self, view, traj, workers):
        return self._rotation.next(workers)


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastLoadedRouter(Router):
    name = "least-loaded-router"

    def route(self, view, traj, workers):
        return _least_loaded(workers)


@mypyc_attr(allow_interpreted_subclasses=True)
class ConsistentHash(Router):
    """The request's route key (a live router's session id, `user` or whole prompt; the
    simulator's trajectory id) on a hash ring with virtual nodes; the first live worker clockwise.
    The ring follows the set of worker ids, so a worker added while running takes its share."""

    name = "consistent-hash"
    VNODES = 64

    def __init__(self) -> None:
        self._ring: list[tuple[int, int]] = []
        self._keys: list[int] = []
        self._ids: frozenset[int] = frozenset()

    @staticmethod
    def _h(text: str) -> int:
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")

    def route(self, view, traj, workers):
        ids = frozenset(w.id for w in view.workers)
        if ids != self._ids:
            self._ring = sorted((self._h(f"{wid}#{i}"), wid) for wid in ids for i in range(self.VNODES))
            self._keys = [k for k, _ in self._ring]
            self._ids = ids
        allowed = {w.id: w for w in workers}
        key = traj.spec.route_key
        start = bisect_right(self._keys, self._h(f"session-{traj.id}" if key is None else key))
        for i in range(len(self._ring)):
            wid = self._ring[(start + i) % len(self._ring)][1]
            if wid in allowed:
                return allowed[wid]
        return _least_loaded(workers)


@mypyc_attr(allow_interpreted_subclasses=True)
class StickyLeastLoaded(Router):
    name = "sticky-least-loaded"

    def route(self, view, traj, workers):
        home = next((w for w in workers if w.id == traj.home), None)
        return home or _least_loaded(workers)


@mypyc_attr(allow_interpreted_subclasses=True)
class CacheAware(Router):
    """vLLM Router's `cache_aware` policy; defaults are the router's CLI defaults."""

    name = "cache-aware"

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_s: float = 120.0,
                 max_tree_size: int = 2**26, version_switch: str = "when-idle") -> None:
        if version_switch not in VERSION_SWITCHES:
            raise ConfigError(f"version_switch: expected one of {', '.join(VERSION_SWITCHES)}, got {version_switch!r}")
        self.version_switch = version_switch
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size = max_tree_size
        self._tree: PrefixTree | None = None
        self._next_eviction = eviction_interval_s

    def decide(self, view: PoolView) -> Iterator[Action]:
        if self._tree is None:
            self._tree = PrefixTree(len(view.workers))
        if view.now >= self._next_eviction:
            self._tree.evict(self.max_tree_size)
            self._next_eviction = view.now + self.eviction_interval_s
        yield from super().decide(view)

    def route(self, view, traj, workers):
        tree, spec, ctx = self._tree, traj.spec, traj.context
        loads = [w.load for w in workers]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            w = _least_loaded(workers)
        else:
            best = max(workers, key=lambda w: (tree.matched(w.id, spec.group, spec.id, spec.prompt_len, ctx,
                                                            spec.prefix), -w.load, -w.id))
            rate = tree.matched(best.id, spec.group, spec.id, spec.prompt_len, ctx, spec.prefix) / ctx
            w = best if rate > self.cache_threshold else _least_loaded(workers)
        tree.insert(w.id, spec.group, spec.id, spec.prompt_len, ctx, spec.prefix)
        return w
