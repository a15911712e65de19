"""EngineBackend: the controller's Backend protocol over real vLLM servers, on wall-clock time.

This class wires the clock (`clock.WallClock`: streams run only inside `advance()`, `connect()` and
`finish()`, so decisions see a frozen snapshot) and the streams (`streams.Streams`) to the protocol.
Like SimBackend it plays the environment: it alone opens the sealed target lengths, and it plays
the tools. KV use is the controller's own accounting; /metrics only cross-checks it (the reasons:
docs/internals.md, "engine").
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cadencerl.core.backend import EngineStats, Event, Published, Restore, Timer, ToolReturned, refresh_each
from cadencerl.core.environment import Environment, ToolCall
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker
from cadencerl.engine.client import Timeouts, VLLMClient
from cadencerl.engine.clock import EngineRunError, WallClock
from cadencerl.engine.errors import EngineError
from cadencerl.engine.prompts import synthetic_observation, synthetic_prompt
from cadencerl.engine.records import WorkerRecord
from cadencerl.engine.server_metrics import EngineMetrics
from cadencerl.engine.streams import Placement, StreamCounts, Streams

WeightUpdate = Callable[..., None]
"""Called as hook(worker, url, version) when a worker moves to a new policy version, and with
`keep_kv=True` added when its requests are to be kept through the update (a policy that updates
in place: the hook pauses with vLLM's `mode=keep`, see `weights.WeightPusher`)."""


def takes_keep_kv(hook: WeightUpdate) -> bool:
    """Can `hook` be called as hook(worker, url, version, keep_kv=True)?"""
    try:
        inspect.signature(hook).bind(0, "", 0, keep_kv=True)
    except (TypeError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class ServerLimits:
    """What a server told us at connect time: the limits placement must respect."""

    url: str
    max_model_len: int
    kv_tokens: int          # KV capacity of the server, in tokens (cache_config_info)


_PUBLISHED = "published"    # what publish_now posts to the clock


class EngineBackend:
    """The Backend protocol over one `VLLMClient` per worker; time is wall seconds since `start`."""

    def __init__(self, urls: Sequence[str], model: str, key: object, *, seed: int = 0,
                 prompts: dict[int, list[int]] | None = None, timeouts: Timeouts = Timeouts(),
                 weight_update: WeightUpdate | None = None, on_publish_due: Callable[[], None] | None = None,
                 metrics_every_s: float = 1.0, deadline_s: float | None = None) -> None:
        self.urls = list(urls)
        self.model = model
        self.env = Environment(key)          # opens the sealed target lengths: the engine's side
        self.seed = seed
        self._prompts = prompts or {}        # explicit prompt ids by trajectory id (the trainer API)
        self.timeouts = timeouts
        self.weight_update = weight_update
        self.on_publish_due = on_publish_due
        self.metrics_every_s = metrics_every_s
        self.deadline_s = deadline_s
        self._clock = WallClock()
        self._clients = [VLLMClient(u, model=model, timeouts=timeouts, retries=2, backoff_s=0.1) for u in self.urls]
        self.streams = Streams(self._clock, self._clients, uuid.uuid4().hex[:8], self._turn_ended)
        self._publishes_out = 0              # publishes handed to the trainer, not yet delivered
        self._started = False
        self._base_metrics: dict[int, EngineMetrics] = {}
        self.servers: list[ServerLimits] = []
        self.events_processed = 0

    # -- set-up, tear-down and the trainer's side (not part of the protocol) ---------------------

    def connect(self, timeout_s: float = 30.0) -> list[ServerLimits]:
        """Check every server is healthy, serves `model`, and report its limits; raise EngineError
        (at once for a refused connection: these servers should be up)."""
        async def one(client: VLLMClient) -> ServerLimits:
            await client.wait_healthy(timeout_s, refused_is_final=True)   # a refusal: nothing to wait for
            max_len = await client.check_model()
            return ServerLimits(client.base_url, max_len, await client.kv_capacity())

        async def all_() -> list[ServerLimits]:   # spawned: a failure leaves the others to close() to cancel
            checks = [self._clock.spawn(one(c)) for c in self._clients]
            return list(await asyncio.wait_for(asyncio.gather(*checks), timeout_s + 15))

        try:
            self.servers = self._clock.run(all_())
        except TimeoutError:
            raise EngineRunError(f"servers did not answer within {timeout_s + 15:.0f} s") from None
        return self.servers

    def finish(self) -> None:
        """Take a last /metrics sample of the live workers (final preemption and prefix counts)."""
        if self._started and not self._clock.loop.is_closed():
            self._clock.run(self._poll_metrics())

    def close(self) -> None:
        """Cancel whatever still runs, close the connections and the loop; idempotent."""
        self._clock.close(*(c.aclose() for c in self._clients))

    def stop(self) -> None:
        """Make the running `advance()` raise, so the controller's loop ends; safe from any thread."""
        self._clock.fail(EngineRunError("run stopped"))

    def publish_now(self) -> None:
        """The trainer is done with the batch handed out by `on_publish_due`; safe from any thread."""
        self._clock.post(_PUBLISHED)

    def seed_tokens(self, traj: Trajectory, generated: list[int], completed: bool, turn_ends: Sequence[int] = (),
                    observations: Sequence[int] = ()) -> None:
        """A restart: `traj` had generated `generated` in a process before this one, its k-th tool's
        observation (`observations[k]` ids, the ones that tool returns) after `turn_ends[k]` of them;
        its last turn `completed` there, so its one completion is counted."""
        ids, done = self._prompt(traj), 0
        for k, (end, length) in enumerate(zip(turn_ends, observations)):
            ids += generated[done:end]
            ids += synthetic_observation(self.seed, traj.id, k + 1, length)
            done = end
        self.streams.ids[traj.id] = ids + generated[done:]
        if completed:
            self.env.completions[traj.id] = 1

    def call_tool(self, traj: Trajectory) -> None:
        """A restart: `traj` was waiting on its current turn's tool; the call is made again, now."""
        call = self.env.tool_call(traj, self.now())
        if call is None:
            raise EngineRunError(f"trajectory {traj.id} waits on a tool after its last turn")
        self._clock.push(call.returns_at, call)

    def token_ids(self, traj_id: int) -> list[int]:
        """Prompt + generated (+ observation) ids of a trajectory so far."""
        return self.streams.token_ids(traj_id)

    @property
    def records(self) -> list[WorkerRecord]:
        return self.streams.records

    @property
    def counts(self) -> StreamCounts:
        return self.streams.counts

    @property
    def lost(self) -> list[int]:
        return self.streams.lost

    # -- the Backend protocol ---------------------------------------------------------------------

    def now(self) -> float:
        return self._clock.now()

    def start(self, workers: list[Worker]) -> None:
        if not self.servers:
            self.connect()
        self._clock.restart()
        self._started = True
        self.streams.records = [WorkerRecord(w.id, self.urls[w.id], w.kv_capacity, s.kv_tokens)
                                for w, s in zip(workers, self.servers)]
        self._clock.spawn(self._metrics_loop())

    def refresh(self, workers: list[Worker], now: float) -> None:
        """The meters are live (frozen while the loop is not running); the servers' figures as polled."""
        refresh_each(self, workers)

    def kv_committed(self, worker: int) -> int:
        return self.streams.kv_committed(worker)

    def stats(self, worker: int) -> EngineStats:
        """The worker's last /metrics sample (polled every `metrics_every_s` while the loop runs)."""
        r = self.records[worker]
        return EngineStats(r.server_kv_used, r.running, r.waiting, r.preemptions)

    def place(self, traj: Trajectory, worker: int, restore: Restore, delay_s: float) -> None:
        if traj.id not in self.streams.ids:
            self.streams.ids[traj.id] = self._prompt(traj)
        self.streams.open(traj, worker, self.env.target(traj), delay_s)

    def evict(self, traj: Trajectory) -> None:
        self.streams.evict(traj)

    def set_version(self, worker: int, version: int, keep_kv: bool = False) -> None:
        if self.records:
            self.records[worker].versions.append((self.now(), version))
        if self.weight_update is not None:
            extra = {"keep_kv": True} if keep_kv else {}
            try:
                self.weight_update(worker, self.urls[worker], version, **extra)
            except Exception as exc:
                # A worker advances once empty, so a server that died idle is first seen here. One that
                # answers as healthy refused the push (no dev-mode routes, a bad folder): that ends the
                # run. Any other answer (refused, an error, none: a node gone) loses the worker, even if
                # it comes back later: it would come back without these weights.
                verdict = self._clock.run(self._clients[worker].liveness(self.streams.PROBE_TIMEOUT_S))
                if verdict == "healthy":
                    raise
                self.streams.condemn(worker, f"its weight push failed ({' '.join(str(exc).split())[:300]}) "
                                             f"and its /health then was {verdict}")

    def commit(self, now: float) -> None:
        """Placements started their streams already; the loop runs them on the next advance."""

    def schedule(self, time: float, tag: str) -> None:
        self._clock.push(time, Timer(time, tag))

    def publish_at(self, time: float) -> None:
        """A trainer outside (the trainer API) is handed the batch and says when it is done;
        without one, the version exists at `time`, as in the simulator."""
        if self.on_publish_due is None:
            self._clock.push(time, Published(time))
            return
        self._publishes_out += 1
        self.on_publish_due()

    def advance(self, until: float) -> list[Event]:
        """Run the streams until wall time `until`, the first due timer, or the first event."""
        clock = self._clock
        if self.deadline_s is not None and self.now() > self.deadline_s:
            clock.fail(EngineRunError(f"run exceeded its deadline of {self.deadline_s:.0f} s"))
        if not clock.events and clock.fatal is None:
            clock.run(clock.pump(until, self.deadline_s))
        if clock.fatal is not None:
            raise clock.fatal
        for _ in clock.take_posted():
            self._publishes_out = max(0, self._publishes_out - 1)
            clock.events.append(Published(self.now()))
        self._deliver_due()
        out, clock.events = clock.events, []
        self.events_processed += len(out)
        return out

    def idle(self) -> bool:
        s = self.streams
        return not (s.by_traj or s.probing or self._clock.has_timers() or self._clock.events
                    or self._publishes_out)

    def next_event_time(self) -> float | None:
        return None   # real time: the controller waits on the servers, it never jumps

    def verify(self) -> list[str]:
        problems = self.streams.problems + self.env.verify()
        if self.streams.by_traj:
            problems.append(f"{len(self.streams.by_traj)} trajectories still placed at the end")
        return problems

    # -- the environment: prompts, turn ends and tools --------------------------------------------

    def _prompt(self, traj: Trajectory) -> list[int]:
        ids = self._prompts.get(traj.id)
        if ids is not None:
            return list(ids)
        return synthetic_prompt(self.seed, traj.group, traj.prompt_len)

    def _turn_ended(self, p: Placement) -> None:
        ended = self.env.reply_ended(p.traj, self.now())
        if isinstance(ended, tuple):
            turn_end, call = ended
            self._clock.push(call.returns_at, call)
            ended = turn_end
        self._clock.emit(ended)

    def _deliver_due(self) -> None:
        for t, item in self._clock.pop_due():
            if isinstance(item, ToolCall):
                traj = item.traj
                obs = synthetic_observation(self.seed, traj.id, traj.turn + 1, item.observation_len)
                self.streams.ids[traj.id] += obs
                self._clock.events.append(ToolReturned(traj, t, item.observation_len))
            else:
                self._clock.events.append(item)

    # -- /metrics cross-check ----------------------------------------------------------------------

    async def _metrics_loop(self) -> None:
        while True:
            await self._poll_metrics()
            await asyncio.sleep(self.metrics_every_s)

    async def _poll_metrics(self) -> None:
        live = [w for w in range(len(self.urls)) if w not in self.streams.dead]

        async def one(w: int) -> tuple[int, EngineMetrics | None]:
            try:
                return w, await asyncio.wait_for(self._clients[w].metrics(), self.timeouts.request)
            except (EngineError, TimeoutError):
                return w, None

        for w, m in await asyncio.gather(*(one(w) for w in live)):
            if m is not None:
                base = self._base_metrics.setdefault(w, m)
                self.records[w].sample(m, base, self.kv_committed(w))
