"""MISA-T: admission for mixed RLVR / RLHF / agentic rollouts, in front of any placement policy.

Three mechanisms (the MISA-T abstract), every figure observable: adaptive session admission (a
worker's session cap ramped from the KV block-time learned per class, corrected by the pressure the
engine reports and, in front of a router, bounded by the running batch and pooled across workers);
workload-aware KV quotas per class, unused quota lent out; and admission by class deficit against
the current version's cohort, so each batch gets the trainer's mix. Continuations always pass.
Where the paper is silent the constants below and K = HIGH x the pool's KV are this code's choices.
The formulas, the reasons and what was measured for each: docs/policies/misa-t.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain

from mypy_extensions import mypyc_attr

from cadencerl.admission.gated import Gated
from cadencerl.admission.misa_goodput import GoodputClimb
from cadencerl.admission.misa_learn import Learner
from cadencerl.config import ConfigError
from cadencerl.core.actions import Action, Admit, Place
from cadencerl.core.mix import target_counts
from cadencerl.core.policy import Policy
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker

HIGH, LOW, TARGET = 0.90, 0.70, 0.80   # KV use bands: decrease above HIGH, grow toward TARGET below LOW
DECREASE = 0.8                        # multiplicative decrease; its inverse bounds one growth step
MIN_SCALE, MAX_SCALE = 0.05, 4.0
INITIAL_SCALE = 0.5                   # of the first (unmeasured) capacity estimate
ADAPT_EVERY_S = 1.0
MAX_CAP_FACTOR = 4                    # a worker's cap never exceeds this times its max_num_seqs
MAX_AHEAD = 0.02                      # of a batch: how far a class may run ahead of its share
SHARE_EWMA = 0.05                     # weight of one look in the share of sessions on the engine


@dataclass
@mypyc_attr(allow_interpreted_subclasses=True)
class MisaT:
    """MISA-T's state: per-worker session caps, per-class caps, and what it learned of each class."""

    target_mix: dict[str, float]
    caps: dict[int, float] = field(default_factory=dict)
    scale: dict[int, float] = field(default_factory=dict)
    last_preemptions: dict[int, int] = field(default_factory=dict)
    class_caps: dict[str, int] = field(default_factory=dict)
    admitted: dict[str, int] = field(default_factory=dict)     # sessions admitted so far, per class
    cohorts: dict[int, dict[str, int]] = field(default_factory=dict)   # per policy version, per class
    learner: Learner = field(default_factory=Learner)
    one_cohort: bool = False        # new sessions only into the cohort being balanced (see Admitted)
    kv_is_pressure: bool = True   # False in front of a policy that never over-commits KV (see Admitted)
    climb: GoodputClimb | None = None   # over-commit when measured goodput says it pays (misa_goodput.py)
    boost: float = 1.0              # the climber's multiplier on the KV bands (1: hold what is measured)
    engine_share: float = 1.0       # of the admitted sessions, the share running or queued at an engine
    _next_adapt: float = 0.0
    _kept: dict | None = None       # this pass's answers, until the next action is applied (`begin_pass`)

    @property
    def pooled(self) -> bool:
        """One cap for the pool, the workers' caps summed: wherever a cohort fills one version's
        workers at a time (in front of a router; docs/policies/misa-t.md, "Pooled caps")."""
        return self.one_cohort

    # -- observation ------------------------------------------------------------------------------

    def observe(self, view: PoolView) -> None:
        for w in view.alive():
            if w.id not in self.scale:
                self.scale[w.id] = INITIAL_SCALE
                self.last_preemptions[w.id] = w.preemptions
        if view.now < self._next_adapt and self.class_caps:
            return
        self._next_adapt = view.now + ADAPT_EVERY_S
        self.learner.learn(view.now, count_streamed=self.climb is not None)
        if self.climb is not None:
            self.boost = self.climb.look(view.now, self.learner.decoded, view.trainer_version)
        held = self.learner.held_off_engine()
        per_session = self._session_kv(view)
        measured = self.learner.all_warm(self.target_mix)
        self._observe_share(view)
        for w in view.alive():
            per_scale = self.boost * HIGH * w.kv_capacity / per_session    # the cap at scale 1: the capacity estimate
            self._adapt(w, held.get(w.id, 0), measured, per_scale)
            self.caps[w.id] = max(min(self.scale[w.id] * per_scale, self._slot_cap(w)), 1.0)
        self._allocate(view)

    def _observe_share(self, view: PoolView) -> None:
        """The share of admitted sessions that want an engine now (running or queued there), the
        rest waiting on a tool or to be placed: EWMA over looks."""
        sessions = sum(w.sessions for w in view.alive())
        if sessions > 0:
            share = min(1.0, sum(len(w.residents) for w in view.alive()) / sessions)
            self.engine_share += SHARE_EWMA * (share - self.engine_share)

    def _slot_cap(self, w: Worker) -> float:
        """In front of a router, the sessions whose engine demand fills HIGH of `w`'s running batch
        (Little's law: sessions x share on the engine): past it the engine queues, and a queued
        continuation's cached prefix is the least recently used, the first evicted."""
        return self._slot_caps([w])[0]

    def _slot_caps(self, workers: list[Worker]) -> list[float]:
        """`_slot_cap` of each of `workers` (their factor on max_num_seqs is one for all)."""
        per_seq: int | float = MAX_CAP_FACTOR       # an int unless KV is pressure (the caps read as before)
        if self.kv_is_pressure:
            per_seq = min(MAX_CAP_FACTOR, HIGH / max(self.engine_share, 1e-3))
        return [per_seq * w.max_num_seqs for w in workers]

    def admitted_session(self, traj: Trajectory) -> None:
        """A new session passed the gate: count it, and learn its figures when it finishes."""
        self.learner.track(traj)
        self.record(traj.workload_class, traj.tag if traj.tag is not None else 0)

    def books(self) -> dict:
        """The sessions admitted per class, and per version (the cohorts the mix is kept in)."""
        return {"admitted": dict(self.admitted), "cohorts": {str(v): dict(c) for v, c in self.cohorts.items()}}

    def take_up(self, books: dict) -> None:
        self.admitted = dict(books.get("admitted", {}))
        self.cohorts = {int(v): dict(c) for v, c in books.get("cohorts", {}).items()}

    def record(self, cls: str, version: int) -> None:
        """Count one admission of class `cls` under policy version `version`."""
        self.admitted[cls] = self.admitted.get(cls, 0) + 1
        cohort = self.cohorts.setdefault(version, {})
        cohort[cls] = cohort.get(cls, 0) + 1
        for old in [v for v in self.cohorts if v < version - 4]:
            del self.cohorts[old]

    def _adapt(self, w: Worker, held: int, measured: bool, per_scale: float) -> None:
        """Correct the capacity estimate from the pressure the engine reports (tool-held KV included).

        A decrease takes the cap to DECREASE of what it was but never below DECREASE of the sessions
        in flight: a cap already under them admits nothing, so shrinking it further while the
        pressure lasts (sessions grow as they age) stops no admission and only starves the pool
        once the pressure is gone (anti-windup)."""
        preempted = w.preemptions > self.last_preemptions[w.id]
        self.last_preemptions[w.id] = w.preemptions
        use = (w.engine_kv + held) / w.kv_capacity if self.kv_is_pressure else 0.0
        s, b = self.scale[w.id], self.boost
        if preempted or w.num_waiting > 0 or use > b * HIGH:
            s = min(s, max(s * DECREASE, DECREASE * w.sessions / per_scale))
        elif measured and use < b * LOW and w.id in self.caps and w.sessions >= int(s * per_scale):   # it binds
            s *= min(1.0 / DECREASE, b * TARGET / use) if use > 0 else 1.0 / DECREASE
        self.scale[w.id] = min(max(s, MIN_SCALE), MAX_SCALE)

    def _figures(self, view: PoolView) -> tuple[dict[str, float], dict[str, float]]:
        """Each class's footprint and duration (1 s for all until every class has learned one)."""
        footprint = {}
        for cls in self.target_mix:
            head = view.fresh.peek({cls})
            footprint[cls] = self.learner.footprint(cls, head.prompt_len if head else None,
                                                    _reply_bound(view, cls, head))
        durations = {c: d for c in self.target_mix if (d := self.learner.duration(c)) is not None}
        if len(durations) < len(self.target_mix):
            durations = {c: 1.0 for c in self.target_mix}
        return footprint, durations

    def _session_kv(self, view: PoolView) -> float:
        """KV tokens an admitted session holds on average, weighted by how long each class holds it."""
        f, d = self._figures(view)
        weight = sum(m * d[c] for c, m in self.target_mix.items()) or 1.0
        return max(1.0, sum(m * d[c] * f[c] for c, m in self.target_mix.items()) / weight)

    def _allocate(self, view: PoolView) -> None:
        """Per-class session caps from the block-time KV quotas."""
        k = HIGH * sum(w.kv_capacity for w in view.alive())
        f, d = self._figures(view)
        demand = {c: m * f[c] * d[c] for c, m in self.target_mix.items()}
        total = sum(demand.values()) or 1.0
        slots = sum(int(self.caps.get(w.id, 1)) for w in view.alive())
        residency = {c: m * d[c] for c, m in self.target_mix.items()}
        share = sum(residency.values()) or 1.0
        self.class_caps = {}
        for c in demand:
            quota = k * demand[c] / total                      # KV tokens protected for class c
            # its sessions: the quota over a footprint, and its Little's-law share of the pool's caps
            self.class_caps[c] = max(1, int(min(quota / f[c], slots * residency[c] / share)))

    # -- the gate ---------------------------------------------------------------------------------

    def begin_pass(self) -> None:
        """Answers kept from one applied action to the next of a decision pass, until `end_pass`: only
        an applied action changes what they read there, and a router asks the same ones up to three
        times an admission (the policy's choice, its workers, the controller's check); `applied`
        forgets them. (Not a context manager: a generator's, a pass, was 2% of a router's request.)"""
        self._kept = {}

    def end_pass(self) -> None:
        self._kept = None

    def applied(self) -> None:
        """An action of the pass was applied: the kept answers may be stale."""
        if self._kept is not None:
            self._kept.clear()

    def _keep(self, key: object, compute: Callable, view: PoolView, *args):
        kept = self._kept
        if kept is None:
            return compute(view, *args)
        if key not in kept:
            kept[key] = compute(view, *args)
        return kept[key]

    def deficits(self, waiting: list[str], horizon: float, counts: dict[str, int]) -> dict[str, float]:
        """Sessions each waiting class is behind its share of the cohort admitted so far (`counts`),
        its share moved ahead by its expected completion time against the mix's mean: the lead is
        at most `horizon` sessions (the cohort a version admits: about a batch) and shrinks to zero
        as the cohort fills, so a cohort ends on the target mix with its slow sessions started first."""
        mix = {c: self.target_mix.get(c, 0.0) for c in waiting}
        norm = sum(mix.values()) or 1.0
        mix = {c: m / norm for c, m in mix.items()}
        done = sum(counts.get(c, 0) for c in waiting) + 1
        durations = {c: d for c in waiting if (d := self.learner.duration(c)) is not None}
        lead = {c: 0.0 for c in waiting}
        if len(durations) == len(waiting):
            mean = sum(mix[c] * durations[c] for c in waiting)
            fade = max(0.0, 1.0 - done / horizon) if horizon > 0 else 0.0
            lead = {c: fade * max(-horizon, min(horizon, self.learner.rate * (durations[c] - mean))) for c in waiting}
            shift = sum(mix[c] * lead[c] for c in waiting)    # re-centred after clipping: the deficits
            lead = {c: x - shift for c, x in lead.items()}     # sum to 1, so some class is always behind
        return {c: mix[c] * (done + lead[c]) - counts.get(c, 0) for c in waiting}

    def cohort_places(self, view: PoolView, waiting: list[str], version: int) -> dict[str, int]:
        """Each waiting class's places in the cohort being filled: its target share (rounded
        as the trainer rounds a batch) of what the cohort will hold, the sessions it admitted so far
        plus the room the eta budget leaves it. A class that used its places waits even when a class
        still behind is held by its cap: the cohort is what the next batches consume (under eta 1 a
        full cohort is exactly one batch), so a session lent another class's place stays in it."""
        counts = self.cohorts.get(version, {})
        room = min(len(view.fresh), view.credits.admissible(version, view.next_batch))
        size = sum(counts.get(c, 0) for c in waiting) + room
        return target_counts({c: self.target_mix.get(c, 0.0) for c in waiting}, size)

    def filling(self, view: PoolView) -> int:
        return self._keep("filling", self._filling, view)

    def _filling(self, view: PoolView) -> int:
        """The cohort new sessions join: the trainer's, or in front of a router the oldest version
        a live worker is on that has eta budget left (the router fills it before its workers move)."""
        if not self.one_cohort:
            return view.trainer_version
        admissible, batch = view.credits.admissible, view.next_batch
        open_ = [v for v in {w.version for w in view.workers if w.alive} if admissible(v, batch) > 0]
        return min(open_) if open_ else view.trainer_version

    def open_classes(self, view: PoolView, version: int | None = None) -> set[str]:
        return self._keep(("open", version), self._open_classes, view, version)

    def _open_classes(self, view: PoolView, version: int | None) -> set[str]:
        """The class to admit next: among waiting classes with a place left in the cohort (of
        `version`, the one the session will join, or else the one being filled), within their
        quota (`_within_quota`) and not too far ahead of their share, the one furthest behind.
        Deficits are taken among the classes with places left, so one of them is always at or below
        its share: only the caps (and, where the quotas step aside, the places) close the gate."""
        active = view.active_by_class
        waiting = view.fresh.classes()
        unused = {c: max(0, cap - active.get(c, 0)) for c, cap in self.class_caps.items()}
        version = self.filling(view) if version is None else version
        cohort = self.cohorts.get(version, {})
        places = self.cohort_places(view, waiting, version)
        left = [c for c in waiting if cohort.get(c, 0) < places[c]]    # never empty while there is room
        # a class alone is one session behind, whatever it admitted (`deficits`' answer, not asked)
        deficit = self.deficits(left, view.credits.batch_size, cohort) if len(left) > 1 else {c: 1.0 for c in left}
        bound = MAX_AHEAD * view.credits.batch_size
        spare = sum(unused.values())
        open_ = [c for c in left if self._within_quota(c, active.get(c, 0), spare - unused.get(c, 0))
                 and deficit[c] > -bound]
        if not open_:
            return set()
        return {max(open_, key=lambda c: (deficit[c], c))}

    def _within_quota(self, cls: str, active: int, lent: int) -> bool:
        """Under its class cap plus the quota the other classes leave unused (`lent`); always, in
        front of a policy that never over-commits KV (see the module's docstring)."""
        return not self.kv_is_pressure or active < self.class_caps.get(cls, 1) + lent

    def accepting(self, view: PoolView, workers: list[Worker]) -> list[bool]:
        """Each worker under its cap or, `pooled`, the pool under its cap and the worker under its
        running-batch bound; with `one_cohort` (in front of a router), on the version of the cohort
        being filled in `view` (the one `open_classes` balances in the same view)."""
        if self.pooled and self.remaining(view) <= 0:
            return [False] * len(workers)
        cohort = self.filling(view) if self.one_cohort else None
        caps = self._slot_caps(workers) if self.pooled else [int(self.caps.get(w.id, 1)) for w in workers]
        return [w.sessions < cap and (cohort is None or w.version == cohort) for w, cap in zip(workers, caps)]

    def accepts(self, view: PoolView, w: Worker) -> bool:
        return self.accepting(view, [w])[0]

    def remaining(self, view: PoolView) -> int:
        return self._keep("remaining", self._remaining, view)

    def _remaining(self, view: PoolView) -> int:
        """New sessions the pool may still take: under each worker's cap or, `pooled`, under their sum
        (a worker with no cap yet, before its first look, has a cap of 1, as in `accepts`)."""
        alive = view.alive()
        caps = [int(self.caps.get(w.id, 1)) for w in alive]
        if self.pooled:
            return max(0, sum(caps) - sum(w.sessions for w in alive))
        return sum(max(0, cap - w.sessions) for cap, w in zip(caps, alive))


def overloaded(w: Worker, extra: int) -> bool:
    """Is `w` too loaded to take back a continuation of `extra` tokens? (its engine queues, or its
    committed KV would pass HIGH)"""
    return w.num_waiting > 0 or w.kv_used + extra > HIGH * w.kv_capacity


@mypyc_attr(allow_interpreted_subclasses=True)
class Admitted(Gated):
    """ADMISSION+PLACEMENT: MISA-T decides which new sessions may start; `inner` places them.

    MISA-T is the policy's `gate` (an AdmissionGate): the controller hands it to every view."""

    def __init__(self, misa: MisaT, inner: Policy, label: str = "misa") -> None:
        super().__init__(misa, inner, f"{label}+{inner.name}")
        self.misa = misa
        # A placement policy that never over-commits KV (CadenceRL packs it and evicts to its pending
        # set) keeps it full on purpose: there only preemptions and engine queues are pressure, and
        # the caps step aside when there is none.
        if misa.climb is not None and not self.queues_at_engine:
            raise ConfigError(f"admission: {label} climbs over-commit past the KV bands, and {inner.name} "
                              "never over-commits KV (full KV is its packing); use misa")
        misa.kv_is_pressure = self.queues_at_engine
        misa.one_cohort = self.queues_at_engine

    def decide(self, view: PoolView) -> Iterator[Action]:
        misa = self.misa
        misa.observe(view)
        misa.begin_pass()
        try:
            for action in chain(keep_home(view) if self.queues_at_engine else (), self.inner.decide(view)):
                yield action
                misa.applied()                 # by the controller, before it asks for the next
                if isinstance(action, Admit):
                    misa.admitted_session(view.workers[action.worker].residents[action.traj])
        finally:
            misa.end_pass()


def keep_home(view: PoolView) -> Iterator[Action]:
    """A router's continuations go back to the worker holding their prefix unless it is overloaded
    (the router's balance rule would otherwise move them and lose it) or above the mean load of its
    version's workers: a hot spot (why, and what it cost: docs/policies/misa-t.md, "Continuations")."""
    for v in view.pending.versions():
        peers = [w for w in view.alive() if w.version == v]
        total = sum(w.load for w in peers)
        for traj in sorted(view.pending.at(v), key=lambda t: (t.departed_at, t.id)):
            home = view.workers[traj.home] if traj.home is not None else None
            if home is None or not home.alive or home.version != v or overloaded(home, traj.context) \
                    or traj.pin not in (None, home.id):     # pinned elsewhere: the router places it there
                continue
            if home.load * len(peers) <= total:    # at or under the mean load
                yield Place(traj.id, home.id)
                total += 1


def _reply_bound(view: PoolView, cls: str, head: Trajectory | None) -> int | None:
    """The longest reply a waiting session of `cls` may add (its request's max_tokens), or None when
    one names none: the first caps, sized for all the class's waiting sessions, must hold the longest.
    Only the router's requests name one; a queue whose head names none is never walked (the simulator's)."""
    if head is None or head.spec.max_new_tokens is None:
        return None
    hints = [t.spec.max_new_tokens for t in view.fresh.in_order() if t.workload_class == cls]
    bounds = [h for h in hints if h is not None]
    return max(bounds) if len(bounds) == len(hints) else None
