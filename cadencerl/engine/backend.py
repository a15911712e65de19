"""EngineBackend: the controller's Backend protocol over real vLLM servers, on wall-clock time.

Why this shape:
- One private asyncio loop, driven only inside `advance()` (and `connect()`, `finish()`). Between
  two advances nothing moves, so a decision sees one consistent snapshot of every token count
  (policies read live contexts through `traj.meter`) and no lock is needed. Timers, tool returns
  and the controller's own ticks all run off the same monotonic clock; every wait has a timeout.
- The backend plays the environment, like SimBackend: it alone opens the sealed target lengths
  and asks a server for exactly the tokens left in the current turn (`max_tokens`, EOS ignored).
  It keeps every trajectory's token ids, so an evicted or lost trajectory resumes on any worker
  from its last received token (token transfer + re-prefill; the prefix cache makes a return to
  the same worker cheap).
- A broken stream is not a broken run: the worker is probed once; a dead server becomes one
  `WorkerLost` event (the controller sends its residents back to pending), a live one gets the
  request re-issued from its last token, a bounded number of times.
- KV use is the controller's own token accounting (contexts of the placed trajectories);
  /metrics is polled alongside only to cross-check it and to report preemptions and prefix hits.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import queue
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from cadencerl.core.backend import (
    EngineStats,
    Event,
    Finished,
    Restore,
    Timer,
    ToolReturned,
    TurnEnded,
    WorkerLost,
)
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker
from cadencerl.engine.tiny_model import TINY_ARCH
from cadencerl.engine.client import (
    EngineError,
    EngineMetrics,
    Timeouts,
    VLLMClient,
)
from cadencerl.core.trajectory import turn_target

WeightUpdate = Callable[[int, str, int], None]
"""Called as hook(worker, url, version) when a worker moves to a new policy version."""

TimerHook = Callable[[float, str], bool]
"""Offered every scheduled timer first; returning True means the caller delivers it via `post`."""


class EngineRunError(RuntimeError):
    """The real-engine run cannot go on (a server problem, a deadline); one line."""


@dataclass(frozen=True)
class ServerInfo:
    """What a server told us at connect time."""

    url: str
    max_model_len: int
    kv_tokens: int          # KV capacity of the server, in tokens (cache_config_info)


@dataclass
class CacheCounts:
    """Prefix-cache counters over the run, shaped like the simulator's cache for `summarize`."""

    hits: int = 0
    queried: int = 0


@dataclass
class WorkerRecord:
    """One worker over the run: the controller's accounting and the server's /metrics side by side.

    Shaped like a SimEngine where `metrics.summarize` reads it (tokens, preemptions, prefix cache)."""

    worker: int
    url: str
    kv_capacity: int                     # tokens the controller may commit
    server_kv_tokens: int                # tokens the server holds
    alive: bool = True
    tokens_generated: int = 0            # tokens received from this worker (kept or not)
    prompt_tokens_sent: int = 0
    prefill_tokens: int = 0              # prompt tokens sent less the server's prefix-cache hits
    preemptions: int = 0                 # the server's num_preemptions_total over the run
    preemptions_by_class: dict = field(default_factory=dict)  # not observable on a real server
    cache: CacheCounts = field(default_factory=CacheCounts)
    committed: int = 0                   # controller's KV tokens at the last metrics sample
    server_kv_used: int = 0              # server's kv_cache_usage_perc x its capacity, same sample
    running: int = 0
    waiting: int = 0
    samples: int = 0
    max_committed: int = 0
    max_server_kv_used: int = 0
    max_running: int = 0
    max_waiting: int = 0
    max_kv_gap: int = 0                  # largest |server - controller| KV tokens over the samples
    versions: list[tuple[float, int]] = field(default_factory=list)  # (time, version) updates


@dataclass(eq=False)
class _Stream:
    """One placement of a trajectory's current turn on a worker; also the trajectory's meter."""

    traj: Trajectory
    worker: int
    start: int                   # generated tokens when placed
    target: int                  # generated-token count at which the turn ends
    received: list[int] = field(default_factory=list)
    live: bool = True            # False once evicted or completed: later tokens are dropped
    failed: bool = False         # the stream broke; awaiting the worker's probe
    attempts: int = 0
    request_id: str = ""
    task: asyncio.Task | None = None

    def generated(self) -> int:
        return self.start + len(self.received)


def synthetic_prompt(seed: int, group: int, length: int, vocab: int = TINY_ARCH.vocab_size) -> list[int]:
    """Seeded random prompt ids; every sample of a group shares them (a longer one extends them)."""
    return np.random.default_rng([seed, group]).integers(1, vocab, length).tolist()


def synthetic_observation(seed: int, traj_id: int, turn: int, length: int,
                          vocab: int = TINY_ARCH.vocab_size) -> list[int]:
    return np.random.default_rng([seed, 1, traj_id, turn]).integers(1, vocab, length).tolist()


def kv_tokens_from_metrics(text: str) -> int | None:
    """The server's KV capacity in tokens, from `vllm:cache_config_info` labels."""
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                labels = sample.labels
                if str(labels.get("kv_cache_size_tokens", "")).isdigit():
                    return int(labels["kv_cache_size_tokens"])
                blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
                if blocks.isdigit() and size.isdigit():
                    return int(blocks) * int(size)
    return None


class EngineBackend:
    """The Backend protocol over one `VLLMClient` per worker; time is wall seconds since `start`."""

    MAX_ATTEMPTS = 3            # stream failures on a healthy worker before it counts as lost
    PROBE_TIMEOUT_S = 5.0
    ABORT_TIMEOUT_S = 5.0

    def __init__(self, urls: Sequence[str], model: str, key: object, *, seed: int = 0,
                 prompts: dict[int, list[int]] | None = None, timeouts: Timeouts = Timeouts(),
                 weight_update: WeightUpdate | None = None, timer_hook: TimerHook | None = None,
                 metrics_every_s: float = 1.0, deadline_s: float | None = None) -> None:
        self.urls = list(urls)
        self.model = model
        self._key = key                      # opens the sealed target lengths: the engine's side
        self.seed = seed
        self._prompts = prompts or {}        # explicit prompt ids by trajectory id (the trainer API)
        self.timeouts = timeouts
        self.weight_update = weight_update
        self.timer_hook = timer_hook
        self.metrics_every_s = metrics_every_s
        self.deadline_s = deadline_s
        self._loop = asyncio.new_event_loop()
        self._clients = [VLLMClient(u, model=model, timeouts=timeouts, retries=2, backoff_s=0.1) for u in self.urls]
        self._tag = uuid.uuid4().hex[:8]     # request ids stay unique across runs on one server
        self._seq = itertools.count()
        self._t0 = time.monotonic()
        self._started = False
        self._wake: asyncio.Event | None = None
        self._events: list[Event] = []
        self._heap: list = []                # (time, seq, kind, payload): timers and tool returns
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # tags posted from other threads
        self._external = 0                   # timers taken by `timer_hook`, not yet posted
        self._streams: dict[int, _Stream] = {}             # traj id -> its current placement
        self._by_worker: list[dict[int, _Stream]] = [{} for _ in self.urls]
        self._ids: dict[int, list[int]] = {}                # traj id -> prompt + every token so far
        self._probing: set[int] = set()
        self._dead: set[int] = set()
        self._background: set[asyncio.Task] = set()
        self._fatal: BaseException | None = None
        self._metrics_task: asyncio.Task | None = None
        self._base_metrics: dict[int, EngineMetrics] = {}
        self.servers: list[ServerInfo] = []
        self.records: list[WorkerRecord] = []
        self.completions: dict[int, int] = {}
        self.problems: list[str] = []
        self.lost: list[int] = []
        self.resumes = 0                     # placements that continued from generated tokens
        self.resumes_accepted = 0            # ... whose continued ids the server took and extended
        self.aborts = 0
        self.retries = 0
        self.events_processed = 0

    # -- set-up and tear-down (not part of the protocol) -----------------------------------------

    def connect(self, timeout_s: float = 30.0) -> list[ServerInfo]:
        """Check every server is healthy, serves `model`, and report its limits; raise EngineError."""
        async def one(client: VLLMClient) -> ServerInfo:
            await client.wait_healthy(timeout_s)
            max_len = await client.check_model()
            text = (await client._request("GET", "/metrics")).text
            kv = kv_tokens_from_metrics(text)
            if kv is None:
                raise EngineError("/metrics has no vllm:cache_config_info with the KV size", url=client.base_url)
            return ServerInfo(client.base_url, max_len, kv)

        async def all_() -> list[ServerInfo]:
            return list(await asyncio.wait_for(asyncio.gather(*(one(c) for c in self._clients)), timeout_s + 15))

        try:
            self.servers = self._loop.run_until_complete(all_())
        except TimeoutError:
            raise EngineRunError(f"servers did not answer within {timeout_s + 15:.0f} s") from None
        return self.servers

    def finish(self) -> None:
        """Take a last /metrics sample of the live workers (final preemption and prefix counts)."""
        if self._started and not self._loop.is_closed():
            self._loop.run_until_complete(self._poll_metrics())

    def close(self) -> None:
        """Cancel whatever still runs, close the connections and the loop; idempotent."""
        if self._loop.is_closed():
            return
        tasks = list(self._background)       # streams (evicted ones too), probes, aborts
        if self._metrics_task:
            tasks.append(self._metrics_task)
        for t in tasks:
            t.cancel()

        async def settle() -> None:
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)
            await asyncio.wait_for(asyncio.gather(*(c.aclose() for c in self._clients), return_exceptions=True), 5.0)

        try:
            self._loop.run_until_complete(settle())
        except (TimeoutError, RuntimeError):
            pass
        finally:
            self._loop.close()

    def stop(self) -> None:
        """Make the running `advance()` raise, so the controller's loop ends; safe from any thread."""
        self._fatal = self._fatal or EngineRunError("run stopped")
        self._poke_threadsafe()

    def post(self, tag: str) -> None:
        """Deliver a timer taken by `timer_hook` now; safe from any thread."""
        self._inbox.put(tag)
        self._poke_threadsafe()

    def _poke_threadsafe(self) -> None:
        if not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._poke)
            except RuntimeError:
                pass

    # -- the Backend protocol ---------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self._t0

    def start(self, workers: list[Worker]) -> None:
        if not self.servers:
            self.connect()
        self._t0 = time.monotonic()
        self._started = True
        self.records = [WorkerRecord(w.id, self.urls[w.id], w.kv_capacity, s.kv_tokens)
                      for w, s in zip(workers, self.servers)]
        self._wake = asyncio.Event()
        self._metrics_task = self._loop.create_task(self._metrics_loop())

    def sync(self, now: float) -> None:
        """Nothing to do: the meters are live, and frozen while the loop is not running."""

    def kv_committed(self, worker: int) -> int:
        return sum(s.traj.context for s in self._by_worker[worker].values())

    def stats(self, worker: int) -> EngineStats:
        """The worker's last /metrics sample (polled every `metrics_every_s` while the loop runs)."""
        r = self.records[worker]
        return EngineStats(r.server_kv_used, r.running, r.waiting, r.preemptions)

    def place(self, traj: Trajectory, worker: int, restore: Restore, delay_s: float) -> None:
        if worker in self._dead:
            raise EngineRunError(f"placement on lost worker {worker}")
        if traj.id not in self._ids:
            self._ids[traj.id] = self._prompt(traj)
        s = _Stream(traj, worker, traj.tokens, turn_target(traj, self._key))
        traj.meter = s
        self._streams[traj.id] = s
        self._by_worker[worker][traj.id] = s
        if s.start:
            self.resumes += 1
        if s.generated() >= s.target:        # nothing left of this turn (it ended as it departed)
            self._complete(s)
            return
        self._launch(s, delay_s)

    def evict(self, traj: Trajectory) -> None:
        s = self._streams.get(traj.id)
        if s is None:
            raise EngineRunError(f"evict of trajectory {traj.id}, which is not placed")
        self._release(s)
        self.aborts += 1
        if s.task is not None and not s.task.done():
            s.task.cancel()                  # closing the stream aborts it server-side too
            if s.worker not in self._dead:
                self._spawn(self._abort(s.worker, s.request_id))

    def set_version(self, worker: int, version: int) -> None:
        if self.records:
            self.records[worker].versions.append((self.now(), version))
        if self.weight_update is not None:
            self.weight_update(worker, self.urls[worker], version)

    def commit(self, now: float) -> None:
        """Placements started their streams already; the loop runs them on the next advance."""

    def schedule(self, time_s: float, tag: str) -> None:
        if self.timer_hook is not None and self.timer_hook(time_s, tag):
            self._external += 1
            return
        self._push(time_s, "timer", tag)

    def advance(self, until: float) -> list[Event]:
        """Run the streams until wall time `until`, the first due timer, or the first event."""
        if self.deadline_s is not None and self.now() > self.deadline_s:
            self._fatal = self._fatal or EngineRunError(f"run exceeded its deadline of {self.deadline_s:.0f} s")
        if not self._events and self._fatal is None:
            self._loop.run_until_complete(self._pump(until))
        if self._fatal is not None:
            raise self._fatal
        self._drain_inbox()
        self._fire_due()
        out, self._events = self._events, []
        self.events_processed += len(out)
        return out

    def idle(self) -> bool:
        return not (self._streams or self._heap or self._events or self._external or self._probing)

    def verify(self) -> list[str]:
        problems = list(self.problems)
        dup = [tid for tid, n in self.completions.items() if n != 1]
        if dup:
            problems.append(f"trajectories completed more than once: {dup[:5]}")
        if self._streams:
            problems.append(f"{len(self._streams)} trajectories still placed at the end")
        return problems

    # -- observation -------------------------------------------------------------------------------

    def token_ids(self, traj_id: int) -> list[int]:
        """Prompt + generated (+ observation) ids of a trajectory so far."""
        ids = list(self._ids.get(traj_id, ()))
        s = self._streams.get(traj_id)
        return ids + s.received if s is not None else ids

    # -- the loop ----------------------------------------------------------------------------------

    async def _pump(self, until: float) -> None:
        while not self._events and self._fatal is None and self._inbox.empty():
            now = self.now()
            end = min(until, self._heap[0][0] if self._heap else math.inf)
            if self.deadline_s is not None:
                end = min(end, self.deadline_s + 1e-3)
            if now >= end:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), end - now)
            except TimeoutError:
                pass

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _emit(self, ev: Event) -> None:
        self._events.append(ev)
        self._poke()

    def _drain_inbox(self) -> None:
        while not self._inbox.empty():
            tag = self._inbox.get_nowait()
            self._external = max(0, self._external - 1)
            self._events.append(Timer(self.now(), tag))

    def _push(self, t: float, kind: str, payload) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def _fire_due(self) -> None:
        now = self.now()
        while self._heap and self._heap[0][0] <= now:
            t, _, kind, payload = heapq.heappop(self._heap)
            if kind == "timer":
                self._events.append(Timer(t, payload))
                continue
            traj, obs_len = payload
            self._ids[traj.id] += synthetic_observation(self.seed, traj.id, traj.turn + 1, obs_len)
            self._events.append(ToolReturned(traj, t, obs_len))

    def _prompt(self, traj: Trajectory) -> list[int]:
        ids = self._prompts.get(traj.id)
        if ids is not None:
            return list(ids)
        return synthetic_prompt(self.seed, traj.group, traj.prompt_len)

    def _spawn(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- streams -----------------------------------------------------------------------------------

    def _launch(self, s: _Stream, delay_s: float = 0.0) -> None:
        s.attempts += 1
        s.failed = False
        s.request_id = f"crl-{self._tag}-t{s.traj.id}-{next(self._seq)}"
        s.task = self._spawn(self._run(s, delay_s))

    async def _run(self, s: _Stream, delay_s: float) -> None:
        try:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            prompt = self._ids[s.traj.id] + s.received
            before = s.generated()
            self.records[s.worker].prompt_tokens_sent += len(prompt)

            def on_tokens(new: list[int]) -> None:
                if s.live:
                    self._receive(s, new)

            outcome = await self._clients[s.worker].generate(s.request_id, prompt, s.target - before, on_tokens)
            if not s.live:
                return
            if outcome.finish_reason == "error":
                self._failed(s)
            elif outcome.finish_reason == "aborted":
                self._failed(s)          # nobody here asked for it: treat like a broken stream
            else:
                self.problems.append(f"trajectory {s.traj.id}: stream ended ({outcome.finish_reason}) at "
                                     f"{s.generated()} of {s.target} tokens")
                self._complete(s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug or bad input must end the run, not hang it
            self._fatal = EngineRunError(f"worker {s.worker} ({self.urls[s.worker]}), trajectory {s.traj.id}: {exc}")
            self._poke()

    def _receive(self, s: _Stream, new: list[int]) -> None:
        if s.start and not s.received and s.attempts == 1:
            self.resumes_accepted += 1   # the server took the continued ids and extended them
        s.received.extend(new)
        self.records[s.worker].tokens_generated += len(new)
        if s.generated() >= s.target:
            if s.generated() > s.target:
                self.problems.append(f"trajectory {s.traj.id}: {s.generated()} tokens, target {s.target}")
                del s.received[s.target - s.start:]
            self._complete(s)

    def _release(self, s: _Stream) -> None:
        """The placement ends: its tokens join the trajectory's record and its meter stops."""
        s.live = False
        traj = s.traj
        self._streams.pop(traj.id, None)
        self._by_worker[s.worker].pop(traj.id, None)
        self._ids[traj.id] += s.received
        traj.tokens = s.generated()
        traj.meter = None

    def _complete(self, s: _Stream) -> None:
        self._release(s)
        traj, now = s.traj, self.now()
        spec = traj.spec
        if traj.turn < len(spec.later_turns):
            turn = spec.later_turns[traj.turn]
            self._push(now + turn.tool_latency_s, "tool", (traj, turn.observation_len))
            self._emit(TurnEnded(traj, now))
            return
        if traj.tokens != s.target:
            self.problems.append(f"trajectory {traj.id} ended with {traj.tokens} tokens, target {s.target}")
        self.completions[traj.id] = self.completions.get(traj.id, 0) + 1
        self._emit(Finished(traj, now))

    # -- failures ----------------------------------------------------------------------------------

    def _failed(self, s: _Stream) -> None:
        s.failed = True
        if s.worker not in self._probing and s.worker not in self._dead:
            self._probing.add(s.worker)
            self._spawn(self._probe(s.worker))

    async def _probe(self, worker: int) -> None:
        """A stream broke: is the server alive? Re-issue its broken streams, or report it lost."""
        try:
            try:
                ok = await asyncio.wait_for(self._clients[worker].health(), self.PROBE_TIMEOUT_S)
            except TimeoutError:
                ok = False
            broken = [s for s in self._by_worker[worker].values() if s.failed]
            if ok and all(s.attempts < self.MAX_ATTEMPTS for s in broken):
                for s in broken:
                    self.retries += 1
                    self._launch(s)
            else:
                self._lose(worker)
        finally:
            self._probing.discard(worker)
            self._poke()

    def _lose(self, worker: int) -> None:
        if worker in self._dead:
            return
        self._dead.add(worker)
        self.lost.append(worker)
        if self.records:
            self.records[worker].alive = False
        self._emit(WorkerLost(worker, self.now()))

    async def _abort(self, worker: int, request_id: str) -> None:
        try:
            await asyncio.wait_for(self._clients[worker].abort(request_id), self.ABORT_TIMEOUT_S)
        except (EngineError, TimeoutError):
            pass  # the disconnect aborts it anyway

    # -- /metrics cross-check ----------------------------------------------------------------------

    async def _metrics_loop(self) -> None:
        while True:
            await self._poll_metrics()
            await asyncio.sleep(self.metrics_every_s)

    async def _poll_metrics(self) -> None:
        live = [w for w in range(len(self.urls)) if w not in self._dead]

        async def one(w: int) -> tuple[int, EngineMetrics | None]:
            try:
                return w, await asyncio.wait_for(self._clients[w].metrics(), self.timeouts.request)
            except (EngineError, TimeoutError):
                return w, None

        for w, m in await asyncio.gather(*(one(w) for w in live)):
            if m is not None:
                self._record(w, m)

    def _record(self, w: int, m: EngineMetrics) -> None:
        base = self._base_metrics.setdefault(w, m)
        st = self.records[w]
        st.committed = self.kv_committed(w)
        st.server_kv_used = round(m.kv_cache_usage * st.server_kv_tokens)
        st.running, st.waiting = m.num_requests_running, m.num_requests_waiting
        st.preemptions = m.num_preemptions_total - base.num_preemptions_total
        st.cache.hits = m.prefix_cache_hits_total - base.prefix_cache_hits_total
        st.cache.queried = m.prefix_cache_queries_total - base.prefix_cache_queries_total
        st.prefill_tokens = max(0, st.prompt_tokens_sent - st.cache.hits)
        st.samples += 1
        st.max_committed = max(st.max_committed, st.committed)
        st.max_server_kv_used = max(st.max_server_kv_used, st.server_kv_used)
        st.max_running = max(st.max_running, st.running)
        st.max_waiting = max(st.max_waiting, st.waiting)
        st.max_kv_gap = max(st.max_kv_gap, abs(st.server_kv_used - st.committed))
