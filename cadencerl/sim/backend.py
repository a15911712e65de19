"""SimBackend: a pool of simulated engines on a virtual clock, driven by one event heap.

Engines only wake when something happens to them (a completion, a KV overflow, a prefill end, an
arrival of transferred KV, a tool return), so a run costs O(events), not O(tokens).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol

from cadencerl.core.backend import Event, Published, Restore, Timer, ToolReturned
from cadencerl.core.environment import Environment
from cadencerl.core.trajectory import Meter, Trajectory
from cadencerl.core.worker import Worker
from cadencerl.hardware.perf import WorkerPerf
from cadencerl.sim.engine import Request, SimEngine
from cadencerl.sim.kv_moves import KvMoves
from cadencerl.sim.prefix_cache import PrefixCache

_ENGINE, _ARRIVAL, _TIMER, _TOOL = range(4)
_PUBLISHED = object()      # the timer payload of a trainer step's end


class Weights(Protocol):
    """When new weights reach a worker: `sim/weights.py` models the copies over the links."""

    def ready_at(self, worker: int, version: int, now: float) -> float: ...

    def publish(self, now: float) -> None: ...


class SimBackend:
    def __init__(self, perfs: list[WorkerPerf], key: object, *, exact: bool = False,
                 weights: Weights | None = None, kv: KvMoves | None = None) -> None:
        self._perfs = perfs
        self.env = Environment(key)   # opens the sealed target lengths: the engine decides when EOS happens
        self.exact = exact
        self.weights = weights     # None: version updates are free
        self.kv = kv               # None: no host snapshots or staging at departure
        self.engines: list[SimEngine] = []
        self._heap: list = []
        self._seq = itertools.count()
        self._clock = 0.0
        self._dirty: set[int] = set()
        self._requests: dict[int, Request] = {}
        self._transit: dict[int, int] = {}
        self.events_processed = 0
        self._touched: set[int] = set()     # engines changed since `decoded_tokens` last read them
        self._decoded = 0
        self._counted: list[int] = []       # each engine's share of `_decoded`

    # -- Backend protocol -------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock

    def start(self, workers: list[Worker]) -> None:
        self.engines = [SimEngine(w.id, p, w.kv_capacity, w.max_num_seqs, exact=self.exact,
                                  cache=PrefixCache(block=p.accel.kv_block_tokens))
                        for w, p in zip(workers, self._perfs)]
        self._transit = {w.id: 0 for w in workers}
        for w, e in zip(workers, self.engines):
            w.longest_first = e.order.longest_first
        self._counted = [0] * len(self.engines)

    def decoded_tokens(self) -> int:
        """Decoded tokens so far over every engine (steps observed by `sync` included), kept up
        incrementally: only the engines changed since the last read are re-read."""
        for wid in self._touched:
            e = self.engines[wid]
            now = e.tokens_generated + len(e.running) * e.lag
            self._decoded += now - self._counted[wid]
            self._counted[wid] = now
        self._touched.clear()
        return self._decoded

    def refresh(self, workers: list[Worker], now: float) -> None:
        """Every engine observes the steps finished by `now` (the decoded count takes each one's new
        steps at once) and its worker's figures are written: one pass, as it runs for every worker at
        every decision (the engine's `kv_committed` plus KV in transit; what a server would report)."""
        self._clock = max(self._clock, now)
        counted, transit = self._counted, self._transit
        for w, e in zip(workers, self.engines):
            lag = e.lag
            e.sync(now)
            n = len(e.running)
            if e.lag != lag:
                more = (e.lag - lag) * n
                self._decoded += more
                counted[e.id] += more
            if w.alive:
                held = e.ctx_total + n * e.lag
                w.kv_used = held + e.queued_ctx + transit[w.id]
                # KV in use as vLLM's kv_cache_usage counts it: the running set's, and the blocks
                # prefilling requests already hold (cached prefix and computed chunks)
                w.engine_kv = held + (sum([r.done for r in e.prefilling]) if e.prefilling else 0)
                w.num_waiting, w.preemptions = len(e.waiting), e.preemptions

    def place(self, traj: Trajectory, worker: int, restore: Restore, delay_s: float) -> None:
        engine = self.engines[worker]
        req = Request(traj, engine, traj.tokens, traj.context, self.env.target(traj), restore)
        engine.order.file(req)
        traj.meter = Meter(req)
        self._requests[traj.id] = req
        if delay_s > 0:
            req.in_transit = True
            self._transit[worker] += req.ctx0
            self._push(self._clock + delay_s, _ARRIVAL, req)
        else:
            engine.enqueue(req)
            self._dirty.add(worker)
            self._touched.add(worker)

    def evict(self, traj: Trajectory) -> None:
        req = self._requests.pop(traj.id)
        engine = req.engine
        if req.in_transit:
            req.live = req.in_transit = False
            engine.order.unfile(req)
            self._transit[engine.id] -= req.ctx0
        else:
            engine.remove(req)
            self._dirty.add(engine.id)
            self._touched.add(engine.id)
        traj.tokens = req.generated()
        traj.meter = None
        if self.kv is not None:
            self.kv.depart(traj.id, engine.id, traj.context, self._clock)

    def set_version(self, worker: int, version: int, keep_kv: bool = False) -> None:
        """The worker runs nothing until the new weights have reached it (see `weights.py`), and
        nothing it cached under the old ones is hit again, unless it keeps its KV (vLLM's
        `/pause?mode=keep` clears no cache: its requests and cached prefixes go on as they are)."""
        if not keep_kv:
            self.engines[worker].cache.drop_cached()
        if self.weights is not None:
            self.engines[worker].ready_at = self.weights.ready_at(worker, version, self._clock)
            self._dirty.add(worker)

    def commit(self, now: float) -> None:
        for wid in sorted(self._dirty):
            self._schedule_engine(self.engines[wid], self.engines[wid].restart(now))
        self._touched.update(self._dirty)
        self._dirty.clear()

    def schedule(self, time: float, tag: str) -> None:
        self._push(max(time, self._clock), _TIMER, tag)

    def publish_at(self, time: float) -> None:
        self._push(max(time, self._clock), _TIMER, _PUBLISHED)

    def advance(self, until: float) -> list[Event]:
        """Process events up to `until`; return early, at the first instant that produced events
        for the controller, so that what it schedules in response lands in the right order."""
        out: list[Event] = []
        heap = self._heap
        while heap and heap[0][0] <= until:
            if out and heap[0][0] > self._clock:
                return out
            t, _, kind, payload, epoch = heapq.heappop(heap)
            if kind == _ENGINE:
                engine = self.engines[payload]
                if epoch != engine.epoch:
                    continue
                self._clock = t
                self.events_processed += 1
                self._on_engine(engine, t, out)
            elif kind == _ARRIVAL:
                self._clock = t
                req = payload
                if req.live:
                    req.in_transit = False
                    self._transit[req.engine.id] -= req.ctx0
                    req.engine.sync(t)
                    req.engine.enqueue(req)
                    self._touched.add(req.engine.id)
                    self._schedule_engine(req.engine, req.engine.restart(t))
            elif kind == _TOOL:
                self._clock = t
                out.append(ToolReturned(payload.traj, t, payload.observation_len))
            else:
                self._clock = t
                if payload is not _PUBLISHED:
                    out.append(Timer(t, payload))
                    return out
                if self.weights is not None:
                    self.weights.publish(t)
                out.append(Published(t))
                return out
        self._clock = max(self._clock, until)
        return out

    def idle(self) -> bool:
        return not self._heap

    def next_event_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def verify(self) -> list[str]:
        problems = self.env.verify()
        for e in self.engines:
            if e.peak_kv > e.capacity:
                problems.append(f"worker {e.id} held {e.peak_kv} KV tokens over its capacity {e.capacity}")
            if e.running or e.waiting or e.prefilling:
                problems.append(f"worker {e.id} still holds requests at the end")
        return problems

    # -- internals --------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, payload, epoch: int = 0) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload, epoch))

    def _schedule_engine(self, engine: SimEngine, t: float | None) -> None:
        if t is not None:
            self._push(t, _ENGINE, engine.id, engine.epoch)

    def _on_engine(self, engine: SimEngine, t: float, out: list[Event]) -> None:
        finished: list[Request] = []
        self._touched.add(engine.id)
        nxt = engine.on_event(t, finished)
        for req in finished:
            traj = req.traj
            traj.tokens = req.gen0
            traj.meter = None
            self._requests.pop(traj.id, None)
            ended = self.env.reply_ended(traj, t)
            if isinstance(ended, tuple):
                turn_end, call = ended
                out.append(turn_end)
                self._push(call.returns_at, _TOOL, call)
            else:
                out.append(ended)
        self._schedule_engine(engine, nxt)
