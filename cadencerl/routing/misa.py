"""MISA-T: admission for mixed RLVR / RLHF / agentic rollouts, in front of any placement policy.

Three mechanisms (MISA-T abstract; reference/hardware.md):

* Adaptive session admission. Each worker has a cap on concurrently admitted sessions (a session
  is admitted until it finishes: while it decodes, and while it waits on a tool with its prefix
  cached). The cap adapts to the KV pressure the engine reports: multiplicative decrease when the
  worker preempted since the last look, has a waiting queue, or uses more than `high` of its KV;
  increase when it uses less than `low`: doubling until the first sign of pressure (slow start,
  from `INITIAL_CAP`), one session at a time after it. New sessions beyond the cap wait in HOLD and
  retry; continuations of admitted sessions always pass (the gate never sees them).
* Workload-aware KV-capacity allocation. Class c gets a protected KV quota
      Q_c = K * m_c * BT_c / sum_j m_j * BT_j
  from the trainer's target mix m and the measured block-time BT of a session of each class, so
  that the KV splits in proportion to what each class needs to deliver its share of samples. Its
  session cap is Q_c / f_c, with f_c a session's mean KV footprint. Quota a class leaves unused
  while it has nothing waiting is lent to the others (work conserving).
* Residency-time-aware accounting. A session's demand is block-time, KV x residency time, and its
  residency includes tool gaps; from observable figures only: its mean context ((prompt + final)
  / 2) times its time from admission to completion.

Where the paper is silent (choices, documented and tested): the AIMD constants below, K = `high`
times the pool's KV, an EWMA of the footprints once a class has `WARMUP` completions (before that
the prompt length plus one mean reply of the pool so far), caps clamped to
[1, `MAX_CAP_FACTOR` x max_num_seqs] per worker, and a class's cap also bounded by its quota share
of the pool's session caps, so one class cannot take every worker's slots.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from cadencerl.core.actions import Action, Admit
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.view import AdmissionGate, Policy, PoolView
from cadencerl.core.worker import Worker

HIGH, LOW = 0.90, 0.70          # KV use bands for decrease / increase
DECREASE, INCREASE = 0.8, 1.0   # multiplicative decrease, additive increase (sessions)
ADAPT_EVERY_S = 1.0
WARMUP = 8
EWMA = 0.1
MAX_CAP_FACTOR = 4
INITIAL_CAP = 4


@dataclass
class ClassStats:
    footprint: float = 0.0      # mean KV tokens a session holds over its residency
    duration: float = 0.0       # seconds from admission to completion
    completed: int = 0

    def observe(self, footprint: float, duration: float) -> None:
        if self.completed < WARMUP:
            n = self.completed
            self.footprint = (self.footprint * n + footprint) / (n + 1)
            self.duration = (self.duration * n + duration) / (n + 1)
        else:
            self.footprint += EWMA * (footprint - self.footprint)
            self.duration += EWMA * (duration - self.duration)
        self.completed += 1


@dataclass
class MisaT:
    """MISA-T's state: per-worker session caps, per-class caps, and what it learned of each class."""

    target_mix: dict[str, float]
    caps: dict[int, float] = field(default_factory=dict)
    last_preemptions: dict[int, int] = field(default_factory=dict)
    stats: dict[str, ClassStats] = field(default_factory=dict)
    class_caps: dict[str, int] = field(default_factory=dict)
    slow_start: dict[int, bool] = field(default_factory=dict)
    admitted: dict[str, int] = field(default_factory=dict)     # sessions admitted so far, per class
    _next_adapt: float = 0.0
    _tracked: dict[int, Trajectory] = field(default_factory=dict)   # admitted, unfinished sessions

    # -- observation ------------------------------------------------------------------------------

    def observe(self, view: PoolView) -> None:
        for w in view.alive():
            if w.id not in self.caps:
                self.caps[w.id] = float(INITIAL_CAP)
                self.slow_start[w.id] = True
                self.last_preemptions[w.id] = w.preemptions
        if view.now >= self._next_adapt:
            self._next_adapt = view.now + ADAPT_EVERY_S
            self._learn_footprints()
            for w in view.alive():
                self._adapt(w)
            self._allocate(view)
        elif not self.class_caps:
            self._allocate(view)

    def admitted_session(self, traj: Trajectory) -> None:
        """A new session passed the gate: count it, and learn its footprint when it finishes."""
        self._tracked[traj.id] = traj
        cls = traj.workload_class
        self.admitted[cls] = self.admitted.get(cls, 0) + 1

    def _adapt(self, w: Worker) -> None:
        """AIMD on the pressure the engine reports."""
        preempted = w.preemptions > self.last_preemptions[w.id]
        self.last_preemptions[w.id] = w.preemptions
        use = w.engine_kv / w.kv_capacity
        cap = self.caps[w.id]
        if preempted or w.num_waiting > 0 or use > HIGH:
            cap *= DECREASE
            self.slow_start[w.id] = False
        elif use < LOW and w.sessions >= int(cap):  # grow only a cap that is in use
            cap = cap * 2 if self.slow_start[w.id] else cap + INCREASE
        self.caps[w.id] = min(max(cap, 1.0), MAX_CAP_FACTOR * w.max_num_seqs)

    def _learn_footprints(self) -> None:
        for tid, traj in list(self._tracked.items()):
            if traj.state is State.DONE:
                del self._tracked[tid]
                duration = max(traj.completed_at - traj.admitted_at, 1e-6)
                footprint = (traj.prompt_len + traj.context) / 2
                self.stats.setdefault(traj.workload_class, ClassStats()).observe(footprint, duration)

    def _allocate(self, view: PoolView) -> None:
        """Per-class session caps from the KV quotas (work conserving)."""
        k = HIGH * sum(w.kv_capacity for w in view.alive())
        prior_reply = _mean([s.footprint for s in self.stats.values() if s.completed]) or 1024.0
        demand = {}
        footprint = {}
        for cls, m in self.target_mix.items():
            st = self.stats.get(cls)
            if st and st.completed >= WARMUP:
                footprint[cls], duration = st.footprint, st.duration
            else:
                head = view.fresh.peek({cls})
                footprint[cls] = (head.prompt_len if head else 512) + prior_reply
                duration = 1.0
            demand[cls] = m * footprint[cls] * duration
        total = sum(demand.values()) or 1.0
        slots = sum(int(self.caps.get(w.id, 1)) for w in view.alive())
        self.class_caps = {}
        for c in demand:
            quota = k * demand[c] / total                      # KV tokens protected for class c
            by_kv = quota / footprint[c]
            by_slots = slots * quota / k                        # its share of the session caps
            self.class_caps[c] = max(1, int(min(by_kv, by_slots)))

    # -- the gate ---------------------------------------------------------------------------------

    def open_classes(self, view: PoolView) -> set[str]:
        """The class to admit next: among those under their cap (plus quota lent by classes with
        nothing waiting), the one furthest below its target share of admissions so far."""
        active = view.active_by_class
        waiting = set(view.fresh.classes())
        spare = sum(max(0, cap - active.get(c, 0)) for c, cap in self.class_caps.items() if c not in waiting)
        open_ = [c for c in waiting if active.get(c, 0) < self.class_caps.get(c, 1) + spare]
        if not open_:
            return set()
        total = sum(self.admitted.values()) + 1
        return {max(open_, key=lambda c: (self.target_mix.get(c, 0.0) - self.admitted.get(c, 0) / total, c))}

    def accepts(self, w: Worker) -> bool:
        return w.sessions < int(self.caps.get(w.id, 1))

    def remaining(self, view: PoolView) -> int:
        return sum(max(0, int(self.caps[w.id]) - w.sessions) for w in view.alive() if w.id in self.caps)


class Admitted:
    """ADMISSION+PLACEMENT: MISA-T decides which new sessions may start; `inner` places them.

    MISA-T is the policy's `gate` (an AdmissionGate): the controller hands it to every view."""

    def __init__(self, misa: MisaT, inner: Policy) -> None:
        self.misa = misa
        self.gate: AdmissionGate = misa
        self.inner = inner
        self.name = f"misa+{inner.name}"
        self.kv_transfer = inner.kv_transfer
        self.queues_at_engine = getattr(inner, "queues_at_engine", False)

    def decide(self, view: PoolView) -> Iterator[Action]:
        self.misa.observe(view)
        for action in self.inner.decide(view):
            yield action
            if isinstance(action, Admit):  # applied by now
                self.misa.admitted_session(view.workers[action.worker].residents[action.traj])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
