"""The controller: authoritative state, the trainer, and the one place actions are validated.

The same object drives the simulator and real engines; only the backend differs. Policies propose,
the controller disposes: every action is checked against capacity, version and staleness rules
before the backend sees it, so a buggy policy fails loudly instead of corrupting a run."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from mypy_extensions import mypyc_attr

from cadencerl.config import ControllerSpec
from cadencerl.core.actions import ActionError, Admit, Advance, Batch, Evict, Interrupt, Place, UpdateInPlace
from cadencerl.core.admission_checks import batch_steps, check_budget, check_fits, check_fresh, check_placement
from cadencerl.core.backend import Backend, Finished, Published, Restore, Timer, ToolReturned, TurnEnded, WorkerLost
from cadencerl.core.credits import CreditModel
from cadencerl.core.diagnostics import StallError, all_lost_message, conservation_problems, stall_message
from cadencerl.core.fresh import FreshQueue
from cadencerl.core.journal import JournalSink, NullJournal
from cadencerl.core.journal_state import batch_body
from cadencerl.core.pending import PendingSet
from cadencerl.core.policy import AdmissionGate, Policy
from cadencerl.core.recorder import Recorder
from cadencerl.core.residency import attach, back_from_tool, detach, live_worker, retire, start, to_tool
from cadencerl.core.trainer import MixRule, Trainer
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.view import PoolView, strands_work
from cadencerl.core.worker import Worker

MIX_WAIT = "mix-wait"   # the timer tag of a short class's wait bound running out


@dataclass
class Counters:
    evictions: int = 0
    migrations: int = 0
    kv_transfers: int = 0
    reprefills: int = 0
    migrated_kv_bytes: float = 0.0
    migrated_token_bytes: float = 0.0
    interrupts: int = 0
    in_place_updates: int = 0
    decisions: int = 0
    samples: list[tuple[float, int, float, int]] = field(default_factory=list)  # (t, worker, mean ctx, n)


@mypyc_attr(allow_interpreted_subclasses=True)
class Controller:
    def __init__(self, policy: Policy, backend: Backend, workers: list[Worker], trajectories: list[Trajectory],
                 *, batch_size: int, params: ControllerSpec, train_time_s: float, train_time_per_token_s: float = 0.0,
                 kv_transfer_time: Callable[[Worker, Worker, Trajectory], float | None] | None = None,
                 kv_bytes_per_token: float = 0.0, sample_every_s: float = 5.0, mix: MixRule | None = None) -> None:
        self.policy = policy
        self.gate: AdmissionGate | None = policy.gate   # handed to every view
        self.queues_at_engine = policy.queues_at_engine
        self.backend = backend
        self.workers = workers
        self.trajectories = {t.id: t for t in trajectories}
        self.fresh = FreshQueue(trajectories)
        self.pending = PendingSet()
        self.params = params
        self.credits = CreditModel(batch_size, params.eta, len(trajectories))
        self.trainer = Trainer(self.credits, train_time_s, train_time_per_token_s, mix=mix)
        self.kv_transfer_time = kv_transfer_time
        self.kv_bytes_per_token = kv_bytes_per_token
        self.counters = Counters()
        self.done = 0
        self.active_by_class: dict[str, int] = {}   # admitted, unfinished sessions per workload class
        self.tool_waiting: dict[int, int] = {}   # version -> trajectories off-worker on a tool call
        self.now = 0.0
        self.lost_why: dict[int, str] = {}    # lost worker -> what the backend saw
        self.recorder = Recorder(sample_every_s, self.counters.samples)
        self.on_progress: Callable[[int, int], None] | None = None
        self.journal: JournalSink = NullJournal()    # every state change, for a restart (core/journal.py)
        self.on_start: Callable[[], None] | None = None   # after the backend starts, before the first decision

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        self.backend.start(self.workers)
        if self.on_start is not None:
            self.on_start()
        tick = self.params.tick_s
        self._decide(0.0)
        next_tick = tick
        while not self._finished():
            events = self.backend.advance(next_tick)
            self.now = self.backend.now()
            urgent = False
            for ev in events:
                urgent |= self._handle(ev)
            if urgent or self.now >= next_tick - 1e-12:
                acted = self._decide(self.now)
                if self.now >= next_tick - 1e-12:
                    next_tick = self.now + tick
                if not acted and not events and not self._finished():
                    if self.backend.idle():
                        self._stalled()
                    next_tick = self._skip_idle(next_tick, tick)
            self.journal.flush()
        problems = self.check_conservation()
        if problems:
            raise AssertionError("conservation check failed: " + "; ".join(problems[:5]))

    def _skip_idle(self, next_tick: float, tick: float) -> float:
        """Nothing resident and nothing decided: jump to the first tick at or after the backend's next event."""
        if any(w.residents for w in self.workers):
            return next_tick
        wake = self.backend.next_event_time()
        if wake is None or wake <= next_tick:
            return next_tick
        skipped = math.ceil((wake - next_tick) / tick)
        self.recorder.at_idle_ticks(next_tick, skipped, tick, self.trajectories)
        return next_tick + skipped * tick

    @property
    def traced(self) -> dict[int, list]:
        """Trajectory id -> (t, accelerator, context, KV share) at each decision (see Recorder)."""
        return self.recorder.traced

    @traced.setter
    def traced(self, value: dict[int, list]) -> None:
        self.recorder.traced = value

    def _finished(self) -> bool:
        return self.done == len(self.trajectories) and self.trainer.all_consumed

    def _stalled(self) -> None:
        raise StallError(stall_message(self.policy.name, self.now, len(self.fresh), self.pending, self.done,
                                       len(self.trajectories), self.trainer.version, self.workers, self.params))

    def _handle(self, ev) -> bool:
        """Apply one backend event; True when it warrants an immediate decision."""
        if isinstance(ev, Finished):
            self._finish(ev.traj, ev.time)
            return False
        if isinstance(ev, TurnEnded):
            to_tool(ev.traj, self.workers, self.tool_waiting, ev.time)
            self.journal.log("tool", ev.traj.id, n=ev.traj.tokens)
            return False
        if isinstance(ev, ToolReturned):
            back_from_tool(ev.traj, ev.observation_tokens, self.tool_waiting, self.pending, ev.time)
            self.journal.log("returned", ev.traj.id, obs=ev.observation_tokens)
            return False
        if isinstance(ev, Published):
            self.trainer.publish(ev.time)
            self.journal.published(self.trainer.version, self.trainer.batches[-1].trajectory_ids)
        if isinstance(ev, Published) or (isinstance(ev, Timer) and ev.tag == MIX_WAIT):
            self._maybe_train(ev.time)      # a new version, or a short class's wait ran out
            return True
        if isinstance(ev, WorkerLost):
            self._lose_worker(ev.worker, ev.time)
            self.lost_why[ev.worker] = ev.why
            if not any(w.alive for w in self.workers):
                raise StallError(all_lost_message(ev.time, self.done, len(self.trajectories), self.lost_why))
            return True
        return False

    def _decide(self, now: float) -> bool:
        self.backend.refresh(self.workers, now)
        self.recorder.at_decision(now, self.workers, self.trajectories)
        acted = False
        for action in self.policy.decide(self.view(now)):
            self.apply(action, now)
            acted = True
        self.backend.commit(now)
        self.counters.decisions += 1
        return acted

    def view(self, now: float) -> PoolView:
        """What the policy sees at `now`, with the policy's own admission gate, if it has one."""
        return PoolView(now, self.trainer.version, self.trainer.next_batch, self.workers, self.pending, self.fresh,
                        self.credits, self.trainer.busy_until is not None, self.credits.admitted - self.done,
                        self.tool_waiting, gate=self.gate, active_by_class=self.active_by_class)

    # -- actions --------------------------------------------------------------------------------

    def apply(self, action, now: float) -> None:
        kind = type(action)
        if kind is Admit:
            self._admit(action, now)
        elif kind is Batch:
            self._batch(action, now)
        elif kind is Place:
            self._place_pending(action, now)
        elif kind is Evict:
            self._evict(action, now)
        elif kind is Advance:
            self._advance(action)
        elif kind is Interrupt:
            self._interrupt(action, now)
        elif kind is UpdateInPlace:
            self._update_in_place(action)
        else:
            raise ActionError(f"unknown action {action!r}")

    def _admit(self, a: Admit, now: float) -> None:
        w = live_worker(self.workers, a.worker)
        traj = self._traj(a.traj)
        check_fresh(traj)
        check_budget(self.credits, self.trainer.next_batch, w, 1)
        check_fits(w, traj, traj.context, self.queues_at_engine)
        if self.gate is not None and not self.view(now).accepts_new(w, traj):
            raise ActionError(f"admit on worker {w.id}: the admission layer takes no new session there now")
        self.fresh.take(traj)
        self._start(traj, w, now)
        self.credits.record(w.version)

    def _start(self, traj: Trajectory, w: Worker, now: float) -> None:
        """Admit fresh `traj` on `w` (checked and taken from the fresh queue; the caller records the credit)."""
        start(traj, w.version, self.active_by_class, now)
        self.journal.log("admit", traj.id, tag=w.version)
        self._attach(traj, w, Restore.PREFILL, 0.0, now)

    def _place_pending(self, a: Place, now: float) -> None:
        traj = self._traj(a.traj)
        w = live_worker(self.workers, a.worker)
        check_placement(traj, w, self.pending)
        check_fits(w, traj, traj.context, self.queues_at_engine)
        self._move_in(traj, w, now)

    def _move_in(self, traj: Trajectory, w: Worker, now: float) -> None:
        """Place pending `traj` on `w` (checked), restoring its KV over the link when that is faster."""
        self.pending.remove(traj)
        restore, delay = Restore.PREFILL, 0.0   # back home, the engine's prefix cache may still hold it
        home = self.workers[traj.kv_home] if traj.kv_home is not None else None
        if home is not None and home is not w:
            self.counters.migrations += 1
            traj.migrations += 1
            moved = None
            if self.policy.kv_transfer and home.alive and home.compatible(w) and self.kv_transfer_time:
                moved = self.kv_transfer_time(home, w, traj)   # None: re-prefilling is faster
            if moved is not None:
                restore, delay = Restore.KV_TRANSFER, moved
                self.counters.kv_transfers += 1
                self.counters.migrated_kv_bytes += traj.context * self.kv_bytes_per_token
            else:
                self.counters.reprefills += 1
                self.counters.migrated_token_bytes += 4.0 * traj.context
        self._attach(traj, w, restore, delay, now)

    def _batch(self, batch: Batch, now: float) -> None:
        """Check the lot (see admission_checks), then apply its steps in order (a backend raising
        mid-batch, a lost real server, ends the run as it does for one action: no books reused)."""
        trajs, ws, admitted = batch_steps(batch, self.workers, self.trajectories, self.pending,
                                          self.queues_at_engine)
        if admitted:
            check_budget(self.credits, self.trainer.next_batch, admitted[0], len(admitted))
            self.fresh.take_all([traj for traj, admit in zip(trajs, batch.admits) if admit])
        for traj, w, admit in zip(trajs, ws, batch.admits):
            if admit:
                self._start(traj, w, now)
            else:
                self._move_in(traj, w, now)
        if admitted:
            self.credits.record(admitted[0].version, len(admitted))

    def _attach(self, traj: Trajectory, w: Worker, restore: Restore, delay: float, now: float) -> None:
        attach(traj, w, self.workers, now)
        self.backend.place(traj, w.id, restore, delay)

    def _evict(self, a: Evict, now: float) -> None:
        traj = self._traj(a.traj)
        if traj.state is not State.RESIDENT:
            raise ActionError(f"trajectory {traj.id} is not resident")
        if not traj.resumable:
            raise ActionError(f"trajectory {traj.id} cannot be evicted: its client does not resume a request")
        self.backend.evict(traj)
        detach(traj, self.workers, now)
        traj.state = State.PENDING
        traj.departed_at = now
        self.counters.evictions += 1
        self.pending.add(traj)

    def _advance(self, a: Advance) -> None:
        w = live_worker(self.workers, a.worker)
        if w.residents:
            raise ActionError(f"worker {w.id} cannot advance with {len(w.residents)} residents")
        self._check_newer(w, a.version)
        if strands_work(w, self.workers, self.pending, self.tool_waiting):
            raise ActionError(f"worker {w.id} is the last worker of version {w.version}, which still has work")
        w.version = a.version
        self.backend.set_version(w.id, a.version)
        self.journal.log("worker", w=w.id, v=a.version)
        self._retag_stranded(w)   # only after a lost worker can a skipped version still hold work

    def _retag_stranded(self, w: Worker) -> None:
        """AReaL resumes off-worker trajectories with the new weights: move them to the new version
        when no worker of their old version is left."""
        live = {o.version for o in self.workers if o.alive}
        for v in [v for v in self.pending.versions() if v < w.version and v not in live]:
            for traj in self.pending.at(v):
                self.pending.remove(traj)
                self._new_version(traj, w.version)
                traj.kv_home = None
                self.pending.add(traj)
        stale = [v for v, n in self.tool_waiting.items() if n and v < w.version and v not in live]
        if stale:
            for traj in self.trajectories.values():
                if traj.state is State.TOOL and traj.version in stale:
                    self.tool_waiting[traj.version] -= 1
                    self._new_version(traj, w.version)
                    traj.kv_home = None
                    self.tool_waiting[w.version] = self.tool_waiting.get(w.version, 0) + 1

    def _new_version(self, traj: Trajectory, version: int) -> None:
        traj.versions.append(version)
        self.journal.log("version", traj.id, v=version)

    def _check_newer(self, w: Worker, version: int) -> None:
        if not w.version < version <= self.trainer.version:
            raise ActionError(f"worker {w.id} cannot move from version {w.version} to {version} "
                              f"(trainer at {self.trainer.version})")

    def _interrupt(self, a: Interrupt, now: float) -> None:
        """Abort, update weights, resume in place with re-prefill (the prefix cache is stale)."""
        w = live_worker(self.workers, a.worker)
        self._check_newer(w, a.version)
        residents = list(w.residents.values())
        for traj in residents:
            self.backend.evict(traj)
            detach(traj, self.workers, now)
        w.version = a.version
        self.backend.set_version(w.id, a.version)
        self.journal.log("worker", w=w.id, v=a.version)
        self.counters.interrupts += 1
        for traj in residents:
            self._new_version(traj, a.version)
            traj.kv_home = None
            self._attach(traj, w, Restore.PREFILL, 0.0, now)
        self._retag_stranded(w)

    def _update_in_place(self, a: UpdateInPlace) -> None:
        """Pause, update weights, resume: the residents keep their KV and go on with the new weights."""
        w = live_worker(self.workers, a.worker)
        self._check_newer(w, a.version)
        w.version = a.version
        self.backend.set_version(w.id, a.version, keep_kv=True)
        self.journal.log("worker", w=w.id, v=a.version)
        self.counters.in_place_updates += 1
        for traj in w.residents.values():
            self._new_version(traj, a.version)
        self._retag_stranded(w)

    def _traj(self, tid: int) -> Trajectory:
        traj = self.trajectories.get(tid)
        if traj is None:
            raise ActionError(f"unknown trajectory {tid}")
        return traj

    # -- completions and the trainer ------------------------------------------------------------

    def _finish(self, traj: Trajectory, now: float) -> None:
        if traj.state is not State.RESIDENT:
            raise AssertionError(f"trajectory {traj.id} finished twice or while {traj.state.value}")
        detach(traj, self.workers, now)
        retire(traj, self.workers, self.active_by_class, now)
        self.done += 1
        self.journal.log("complete", traj.id, n=traj.tokens)
        self.trainer.finished(traj)
        self._maybe_train(now)
        if self.on_progress:
            self.on_progress(self.done, len(self.trajectories))

    def _maybe_train(self, now: float) -> None:
        publish_at = self.trainer.try_start(now)
        if publish_at is not None:
            self.journal.log("batch", **batch_body(self.trainer.batches[-1], self.trajectories))
            self.journal.flush(force=True)     # durable before the batch is handed out
            self.backend.publish_at(publish_at)
        elif (wake := self.trainer.wake_request(now)) is not None:   # a short class: form it at the bound
            self.backend.schedule(wake, MIX_WAIT)

    def _lose_worker(self, wid: int, now: float) -> None:
        w = self.workers[wid]
        w.alive = False
        for traj in list(w.residents.values()):
            self.backend.evict(traj)
            detach(traj, self.workers, now)
            traj.kv_home = None
            traj.state = State.PENDING
            traj.departed_at = now
            self.pending.add(traj)
        # The last worker of its version is gone: its work continues under the nearest newer live version.
        newer = [o for o in self.workers if o.alive and o.version > w.version]
        if newer and not any(o.alive and o.version == w.version for o in self.workers):
            self._retag_stranded(min(newer, key=lambda o: o.version))

    # -- conservation -----------------------------------------------------------------------------

    def check_conservation(self) -> list[str]:
        return conservation_problems(self.backend.verify(), self.trajectories.values(), len(self.pending),
                                     self.trainer.consumed)
