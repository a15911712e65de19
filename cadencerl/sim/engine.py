"""One simulated vLLM engine: a running set bounded by max_num_seqs and KV, a FCFS waiting queue,
prefill before decode, and preemption by recompute when the KV of the running set would overflow.

Between events the batch is fixed, so decode advances in closed form (see `DecodeLine`); `exact`
mode takes one step per event instead, as a reference for checking.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from cadencerl.core.backend import Restore
from cadencerl.core.trajectory import Trajectory
from cadencerl.hardware.perf import DecodeLine, WorkerPerf
from cadencerl.sim.prefix_cache import PrefixCache


@dataclass(eq=False, slots=True)
class Request:
    """A trajectory's current turn as the engine holds it."""

    traj: Trajectory
    engine: "SimEngine"
    gen0: int          # tokens generated when it last joined the running set
    ctx0: int          # context then
    target: int        # generated-token count at which this turn ends (engine-only knowledge)
    restore: Restore
    step0: int = -1    # engine step count when it joined the running set; -1 while not running
    joins: int = 0     # invalidates finish-heap entries of earlier stays in the running set
    live: bool = True
    in_transit: bool = False

    def generated(self) -> int:
        if self.step0 < 0:
            return self.gen0
        e = self.engine
        return self.gen0 + e.steps + e.lag - self.step0


@dataclass(eq=False)
class SimEngine:
    id: int
    perf: WorkerPerf
    capacity: int
    max_num_seqs: int
    exact: bool = False
    running: list[Request] = field(default_factory=list)
    waiting: deque[Request] = field(default_factory=deque)
    prefilling: list[Request] = field(default_factory=list)
    prefill_end: float = -1.0      # >= 0 while a prefill pass holds the engine
    steps: int = 0                 # decode steps committed so far
    lag: int = 0                   # steps finished since seg_start, observed by sync but not committed
    ctx_total: int = 0             # KV tokens of the running set at `steps`
    queued_ctx: int = 0            # KV tokens reserved by waiting, in-transit and prefilling requests
    seg_start: float = 0.0         # time of step `steps` (start of the in-progress step)
    line: DecodeLine | None = None
    finish_heap: list = field(default_factory=list)
    event_step: int = 0            # steps from seg_start to the scheduled event
    epoch: int = 0                 # bumps invalidate scheduled events
    tokens_generated: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0
    peak_kv: int = 0
    cache: PrefixCache = field(default_factory=PrefixCache)
    pushes: int = 0
    preemptions_by_class: dict = field(default_factory=dict)

    def kv_committed(self) -> int:
        return self.ctx_total + len(self.running) * self.lag + self.queued_ctx

    def sync(self, now: float) -> None:
        """Observe the decode steps finished by `now` (never the scheduled event's own step).

        Cheap on purpose: the steps are only counted (`lag`); they are folded into the segment
        when the engine next changes, so the scheduled event stays valid."""
        if self.line is None or now <= self.seg_start:
            return
        self.lag = self.line.steps_within(now - self.seg_start, self.event_step - 1)

    def _fold(self) -> None:
        """Commit the observed steps before changing the batch."""
        if self.lag:
            n, self.lag = self.lag, 0
            self._commit(n, self.seg_start + self.line.time(n))

    def _commit(self, n: int, at: float) -> None:
        b = len(self.running)
        self.steps += n
        self.ctx_total += b * n
        self.tokens_generated += b * n
        self.event_step -= n
        self.seg_start = at
        self._reline()

    def _reline(self) -> None:
        b = len(self.running)
        self.line = self.perf.decode_line(b, self.ctx_total) if b and self.prefill_end < 0 else None

    # -- mutations from the controller --------------------------------------------------------------

    def enqueue(self, req: Request) -> None:
        self._fold()
        self.queued_ctx += req.ctx0
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Abort: the request leaves with every token it generated so far."""
        self._fold()
        req.live = False
        if req.step0 >= 0:
            grown = self.steps - req.step0
            self.running.remove(req)
            self.ctx_total -= req.ctx0 + grown
            req.gen0, req.ctx0, req.step0 = req.gen0 + grown, req.ctx0 + grown, -1
            self._release(req)
            if self.prefill_end < 0:
                self._reline()
        else:
            if req in self.waiting:
                self.waiting.remove(req)
                self.queued_ctx -= req.ctx0
            elif req in self.prefilling:
                self.prefilling.remove(req)
                self.queued_ctx -= req.ctx0
                self._release(req)

    # -- the engine's own scheduling ------------------------------------------------------------------

    def restart(self, now: float) -> float | None:
        """After a change: the in-progress step restarts with the new batch; admit; plan."""
        self.epoch += 1
        self._fold()
        if self.prefill_end < 0:
            if self.line is not None:
                self.seg_start = max(self.seg_start, now - self.line.step(0))
            else:
                self.seg_start = now
            self._relieve_overflow()
            self._admit(now)
        return self._plan()

    def on_event(self, now: float, finished: list[Request]) -> float | None:
        """The scheduled event happened at `now`: a step boundary or the end of a prefill."""
        self.epoch += 1
        self.lag = 0  # the event's step count already includes every observed step
        if self.prefill_end >= 0:
            self._join_prefilled(now)
        elif self.line is not None:
            self._commit(self.event_step, now)
        self._collect_finished(finished)
        self._relieve_overflow()
        if self.prefill_end < 0:
            self._admit(now)
        self.cache.trim(self.capacity - self.ctx_total - len(self.running))
        return self._plan()

    def _collect_finished(self, finished: list[Request]) -> None:
        heap = self.finish_heap
        while heap and heap[0][0] <= self.steps:
            _, _, joins, req = heapq.heappop(heap)
            if not req.live or req.step0 < 0 or joins != req.joins:
                continue
            req.live = False
            grown = self.steps - req.step0
            self.running.remove(req)
            self.ctx_total -= req.ctx0 + grown
            req.gen0, req.ctx0, req.step0 = req.gen0 + grown, req.ctx0 + grown, -1
            self._release(req)
            finished.append(req)
        self._reline()

    def _relieve_overflow(self) -> None:
        """vLLM V1 preempts by recompute: the newest running request loses its KV and re-queues first."""
        if not self.running or self.ctx_total + len(self.running) <= self.capacity:
            return
        while self.running and self.ctx_total + len(self.running) > self.capacity:
            req = self.running.pop()
            grown = self.steps - req.step0
            self.ctx_total -= req.ctx0 + grown
            req.gen0, req.ctx0, req.step0 = req.gen0 + grown, req.ctx0 + grown, -1
            req.restore = Restore.PREFILL
            self._release(req)
            self.waiting.appendleft(req)
            self.queued_ctx += req.ctx0
            self.preemptions += 1
            cls = req.traj.spec.workload_class
            self.preemptions_by_class[cls] = self.preemptions_by_class.get(cls, 0) + 1
        self._reline()

    def _admit(self, now: float) -> None:
        """Admit from the waiting queue in order while a slot and KV for its context remain."""
        batch: list[Request] = []
        kv = self.ctx_total + len(self.running)
        slots = self.max_num_seqs - len(self.running)
        while self.waiting and slots > 0:
            req = self.waiting[0]
            if kv + req.ctx0 + 1 > self.capacity:
                break
            self.waiting.popleft()
            batch.append(req)
            kv += req.ctx0 + 1
            slots -= 1
        if not batch:
            return
        self.prefilling = batch
        new, cached = [], []
        for r in batch:
            spec = r.traj.spec
            hit = self.cache.claim(spec.group, spec.id, spec.prompt_len, r.ctx0)
            if r.restore is Restore.PREFILL:
                new.append(r.ctx0 - hit)
                cached.append(hit)
        self.cache.trim(self.capacity - kv)
        if not new:
            self._join_prefilled(now)
            return
        self.prefill_tokens += sum(new)
        self.prefill_end = now + self.perf.prefill_time(new, cached)
        self.line = None

    def _join_prefilled(self, now: float) -> None:
        for req in self.prefilling:
            self.queued_ctx -= req.ctx0
            req.step0 = self.steps
            req.joins += 1
            req.restore = Restore.CACHED
            self.ctx_total += req.ctx0
            self.running.append(req)
            self.pushes += 1  # a deterministic tie-break (memory addresses are not)
            heapq.heappush(self.finish_heap, (self.steps + req.target - req.gen0, self.pushes, req.joins, req))
        self.prefilling = []
        self.prefill_end = -1.0
        self.seg_start = now
        self._reline()
        self.peak_kv = max(self.peak_kv, self.ctx_total)

    def _release(self, req: Request) -> None:
        spec = req.traj.spec
        self.cache.release(spec.group, spec.id, spec.prompt_len, req.ctx0)
        self.cache.trim(self.capacity - self.ctx_total - len(self.running))

    def _plan(self) -> float | None:
        """The time of this engine's next event, or None when it has nothing to do."""
        if self.prefill_end >= 0:
            return self.prefill_end
        if self.line is None:
            return None
        heap = self.finish_heap
        while heap and (not heap[0][3].live or heap[0][3].step0 < 0 or heap[0][2] != heap[0][3].joins):
            heapq.heappop(heap)
        to_finish = heap[0][0] - self.steps
        to_overflow = (self.capacity - self.ctx_total) // len(self.running)
        self.event_step = 1 if self.exact else max(1, min(to_finish, to_overflow))
        return self.seg_start + self.line.time(self.event_step)
