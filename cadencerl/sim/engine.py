"""One simulated vLLM V1 engine: a running set bounded by max_num_seqs and KV, a FCFS waiting
queue, chunked prefill, and preemption by recompute when the KV of the running set would overflow.

Each step has one token budget: running decodes first, then prefill chunks, oldest first. Between
events a pure-decode batch is fixed, so decode advances in closed form (`DecodeLine`); `exact` mode
takes one step per event, as a reference. The model and its simplifications: docs/internals.md,
"sim/engine".
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from cadencerl.core.backend import Restore
from cadencerl.core.trajectory import Trajectory
from cadencerl.hardware.perf import DecodeLine, WorkerPerf
from cadencerl.sim.context_order import ContextOrder
from cadencerl.sim.prefix_cache import PrefixCache

_created = itertools.count()   # requests in the order they are made (one per placement)


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
    left: int = 0      # prompt tokens still to prefill while in `prefilling`
    done: int = 0      # prompt tokens already in KV then (prefix-cache hits and computed chunks)
    seq: int = field(default_factory=_created.__next__)   # creation (placement) order: orders equal contexts
                                                          # as the worker's residents are ordered
    filed: list | None = None    # the context order's list that holds it (ContextOrder)
    key: int = 0                 # its key in that list

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
    running: dict[Request, None] = field(default_factory=dict)   # decoding, in joining order (a dict: O(1) leave)
    waiting: deque[Request] = field(default_factory=deque)
    prefilling: list[Request] = field(default_factory=list)    # admitted, prompt still being computed
    chunks: list = field(default_factory=list)                 # (request, tokens) of the step in progress
    mixed_end: float = -1.0        # >= 0 while a step carrying prefill chunks is in progress
    ready_at: float = 0.0          # new weights arrive then; nothing is admitted or stepped before
    steps: int = 0                 # decode steps committed so far
    lag: int = 0                   # steps finished since seg_start, observed by sync but not committed
    ctx_total: int = 0             # KV tokens of the running set at `steps`
    prefill_kv: int = 0            # KV tokens reserved by prefilling requests (context + first token)
    queued_ctx: int = 0            # KV tokens reserved by waiting, in-transit and prefilling requests
    seg_start: float = 0.0         # time of step `steps` (start of the in-progress step)
    line_key: tuple[int, int] | None = None   # (batch, context at step 0) of the decode line; None: not decoding
    _line: DecodeLine | None = None            # that line, built when first used (`line`)
    _line_of: tuple[int, int] | None = None    # the key `_line` was built for
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
    order: ContextOrder = field(init=False)   # its requests by context, for an eviction of the longest

    def __post_init__(self) -> None:
        self.order = ContextOrder(self)

    def kv_committed(self) -> int:
        return self.ctx_total + len(self.running) * self.lag + self.queued_ctx

    def sync(self, now: float) -> None:
        """Observe the decode steps finished by `now` (never the scheduled event's own step).

        Cheap on purpose: the steps are only counted (`lag`); they are folded into the segment
        when the engine next changes, so the scheduled event stays valid."""
        if self.line_key is None or now <= self.seg_start:
            return
        self.lag = self.line().steps_within(now - self.seg_start, self.event_step - 1)

    def _fold(self) -> None:
        """Commit the observed steps before changing the batch."""
        if self.lag:
            n, self.lag = self.lag, 0
            self._commit(n, self.seg_start + self.line().time(n))
            self._trim()

    def _trim(self) -> None:
        """Evict cached prefixes the running set has grown into. Free KV only shrinks during a segment,
        so trimming at its end evicts what vLLM's per-step allocation would have."""
        self.cache.trim(self.capacity - self.ctx_total - len(self.running) - self.prefill_kv)

    def _commit(self, n: int, at: float) -> None:
        b = len(self.running)
        self.steps += n
        self.ctx_total += b * n
        self.tokens_generated += b * n
        self.event_step -= n
        self.seg_start = at
        self._reline()

    def _reline(self) -> None:
        """File the decode line of the batch as it stands (built only when used: an event changes the
        batch several times before the engine next plans)."""
        b = len(self.running)
        self.line_key = None if not b or self.mixed_end >= 0 else (b, self.ctx_total)

    def line(self) -> DecodeLine:
        """The decode line `_reline` last filed (only while decoding)."""
        line, key = self._line, self.line_key
        if line is None or self._line_of != key:    # most uses find it built
            assert key is not None, "no decode line while not decoding"
            self._line_of = key
            line = self._line = self.perf.decode_line(key[0], key[1])
        return line

    # -- mutations from the controller --------------------------------------------------------------

    def enqueue(self, req: Request) -> None:
        self._fold()
        self.queued_ctx += req.ctx0
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Abort: the request leaves with every token it generated so far."""
        self._fold()
        req.live = False
        self.order.unfile(req)
        if req.step0 >= 0:
            del self.running[req]
            self._leave_running(req)
            self._reline()
        elif req in self.waiting:
            self.waiting.remove(req)
            self.queued_ctx -= req.ctx0
        elif req in self.prefilling:
            self.prefilling.remove(req)
            self.queued_ctx -= req.ctx0
            self.prefill_kv -= req.ctx0 + 1
            self._release(req)

    def _leave_running(self, req: Request) -> None:
        """Take a request out of the running set's accounting (already out of `running`)."""
        grown = self.steps - req.step0
        self.ctx_total -= req.ctx0 + grown
        req.gen0, req.ctx0, req.step0 = req.gen0 + grown, req.ctx0 + grown, -1
        self._release(req)

    # -- the engine's own scheduling ------------------------------------------------------------------

    def restart(self, now: float) -> float | None:
        """After a change: admit, and plan. A step in progress runs to its end (vLLM schedules
        between steps); an idle engine starts at once."""
        self.epoch += 1
        self._fold()
        if self.mixed_end >= 0:
            return self.mixed_end
        if self.line_key is not None:
            self.seg_start = max(self.seg_start, now - self.line().step(0))
        else:
            self.seg_start = now
        self._relieve_overflow()
        self._admit(now)
        if self.line_key is None and self.prefilling and now >= self.ready_at:
            self._start_mixed(now)
        return self._plan(now)

    def on_event(self, now: float, finished: list[Request]) -> float | None:
        """The scheduled event happened at `now`: a step boundary."""
        self.epoch += 1
        self.lag = 0  # the event's step count already includes every observed step
        if self.mixed_end >= 0:
            self._end_mixed(now)
        elif self.line_key is not None:
            self._commit(self.event_step, now)
        self._trim()
        self._collect_finished(finished)
        self._relieve_overflow()
        self._admit(now)
        if self.prefilling and now >= self.ready_at:
            self._start_mixed(now)
        self._trim()
        return self._plan(now)

    def reprefill_estimate(self, tokens: int) -> float:
        """Seconds to prefill `tokens` here in chunks beside the current decode batch."""
        b = len(self.running)
        per = max(1, self.perf.token_budget - b)
        ctx = self.ctx_total + b * self.lag      # as of the last step finished (the same in exact mode)
        total, done = 0.0, 0
        while done < tokens:
            n = min(per, tokens - done)
            total += self.perf.mixed_step_time(b, ctx, [(n, done)])
            done += n
        return total

    def _start_mixed(self, now: float) -> None:
        """One step: every running decode, then prefill chunks oldest first within the token budget."""
        budget = self.perf.token_budget - len(self.running)
        self.chunks = []
        for req in self.prefilling:
            if budget <= 0:
                break
            n = min(req.left, budget)
            self.chunks.append((req, n))
            budget -= n
        self.seg_start = now
        self.mixed_end = now + self.perf.mixed_step_time(len(self.running), self.ctx_total,
                                                         [(n, r.done) for r, n in self.chunks])
        self.line_key = None
        self.event_step = 1
        self.peak_kv = max(self.peak_kv, self.ctx_total + self.prefill_kv)

    def _end_mixed(self, now: float) -> None:
        self.mixed_end = -1.0
        self._commit(1, now)
        for req, n in self.chunks:
            if not req.live or req.step0 >= 0 or req not in self.prefilling:
                continue
            req.left -= n
            req.done += n
            self.prefill_tokens += n
            if req.left == 0:
                self.prefilling.remove(req)
                self.prefill_kv -= req.ctx0 + 1
                self._join(req, first_token=True)
        self.chunks = []
        self._reline()

    def _join(self, req: Request, first_token: bool) -> None:
        """Into the running set; the step that finished a prefill also sampled the first token."""
        self.queued_ctx -= req.ctx0
        req.step0 = self.steps - 1 if first_token else self.steps
        req.joins += 1
        req.restore = Restore.CACHED
        self.ctx_total += req.ctx0 + (1 if first_token else 0)
        self.tokens_generated += 1 if first_token else 0
        self.running[req] = None
        self.order.unfile(req)
        self.order.file(req)
        self.pushes += 1  # a deterministic tie-break (memory addresses are not)
        heapq.heappush(self.finish_heap, (req.step0 + req.target - req.gen0, self.pushes, req.joins, req))
        self.peak_kv = max(self.peak_kv, self.ctx_total + self.prefill_kv)

    def _collect_finished(self, finished: list[Request]) -> None:
        heap = self.finish_heap
        while heap and heap[0][0] <= self.steps:
            _, _, joins, req = heapq.heappop(heap)
            if not req.live or req.step0 < 0 or joins != req.joins:
                continue
            req.live = False
            del self.running[req]
            self._leave_running(req)
            self.order.unfile(req)
            finished.append(req)
        self._reline()

    def _relieve_overflow(self) -> None:
        """vLLM V1 preempts by recompute: the newest request (a prefilling one first, they were
        admitted last) loses its KV and re-queues at the head of the waiting queue."""
        while self.running and self.ctx_total + len(self.running) + self.prefill_kv > self.capacity:
            if self.prefilling:
                req = self.prefilling.pop()
                self.prefill_kv -= req.ctx0 + 1
                self.queued_ctx -= req.ctx0
                self._release(req)
            else:
                req = self.running.popitem()[0]   # the newest
                self._leave_running(req)
                self.order.unfile(req)
                self.order.file(req)
            req.restore = Restore.PREFILL
            self.waiting.appendleft(req)
            self.queued_ctx += req.ctx0
            self.preemptions += 1
            cls = req.traj.spec.workload_class
            self.preemptions_by_class[cls] = self.preemptions_by_class.get(cls, 0) + 1
        self._reline()

    def _admit(self, now: float) -> None:
        """Admit from the waiting queue in order while a slot, KV for its context and token budget
        remain; prefix-cache hits and loaded KV are not recomputed. Nothing runs before new weights."""
        if now < self.ready_at:
            return
        kv = self.ctx_total + len(self.running) + self.prefill_kv
        if not self.waiting:      # most calls: nothing to admit
            self.cache.trim(self.capacity - kv)
            self._reline()
            return
        slots = self.max_num_seqs - len(self.running) - len(self.prefilling)
        budget = self.perf.token_budget - len(self.running) - sum(r.left for r in self.prefilling)
        while self.waiting and slots > 0 and budget > 0:
            req = self.waiting[0]
            if kv + req.ctx0 + 1 > self.capacity:
                break
            self.waiting.popleft()
            kv += req.ctx0 + 1
            slots -= 1
            spec = req.traj.spec
            hit = self.cache.claim(spec.group, spec.id, spec.prompt_len, req.ctx0)
            if req.restore is Restore.PREFILL:
                req.left, req.done = req.ctx0 - hit, hit
                budget -= req.left
                self.prefilling.append(req)
                self.prefill_kv += req.ctx0 + 1
            else:
                self._join(req, first_token=False)
        self.cache.trim(self.capacity - kv)
        self._reline()

    def _release(self, req: Request) -> None:
        spec = req.traj.spec
        self.cache.release(spec.group, spec.id, spec.prompt_len, req.ctx0)
        self._trim()

    def _plan(self, now: float) -> float | None:
        """The time of this engine's next event, or None when it has nothing to do."""
        if self.mixed_end >= 0:
            return self.mixed_end
        if self.line_key is None:
            return self.ready_at if (self.waiting or self.prefilling) and now < self.ready_at else None
        if now < self.ready_at:
            # Paused for new weights with requests kept (`/pause?mode=keep`): they go on from then
            # (the step in progress is redone, a step's time against a pause of seconds), and what
            # waits to be prefilled or admitted joins at that first step.
            self.seg_start = max(self.seg_start, self.ready_at)
            if self.prefilling or self.waiting:
                self.event_step = 0
                return self.ready_at
        heap = self.finish_heap
        while heap and (not heap[0][3].live or heap[0][3].step0 < 0 or heap[0][2] != heap[0][3].joins):
            heapq.heappop(heap)
        if self.prefilling or self.exact:
            self.event_step = 1   # admitted prefills join at the next step boundary
        else:
            to_finish = heap[0][0] - self.steps
            to_overflow = (self.capacity - self.ctx_total) // len(self.running)
            self.event_step = max(1, min(to_finish, to_overflow))
        return self.seg_start + self.line().time(self.event_step)
