"""CadenceRL's decisions on hand-made pool views: the paper's rules, one at a time."""

from __future__ import annotations

from collections import deque

from cadencerl.config import PolicySpec
from cadencerl.core.actions import Admit, Advance, Evict, Place
from cadencerl.core.controller import Controller
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.cadence import Cadence
from cadencerl.core.spec import HiddenLength, TrajectorySpec

KEY = object()
PARAMS = PolicySpec(eta=1, delta=100, headroom_floor=0.1)


def traj(tid, ctx, group=None, version=0, prompt=10):
    t = Trajectory(TrajectorySpec(tid, tid if group is None else group, prompt, HiddenLength(99999, KEY)))
    t.tokens = ctx - prompt
    t.tag = version
    t.versions = [version]
    return t


def worker(wid, cap=10_000, affinity=0, version=0, residents=(), seqs=64):
    w = Worker(wid, f"acc{affinity}", f"c{affinity}", 1, cap, seqs, affinity, version=version)
    for t in residents:
        t.state, t.worker = State.RESIDENT, wid
        w.residents[t.id] = t
    w.kv_used = sum(t.context for t in residents)
    return w


class StubBackend:
    """Accepts every action; the controller's own bookkeeping is what the policy sees."""

    def place(self, traj, worker, restore, delay):
        pass

    def evict(self, traj):
        pass

    def set_version(self, worker, version):
        pass


def view(workers, pending=(), fresh=(), trainer_version=0, admitted=0, total=1000, batch=100, next_batch=0,
         tags=None):
    """A controller holding exactly this state, and the view its policy would get."""
    ctl = Controller(Cadence(PARAMS), StubBackend(), workers, list(fresh), batch_size=batch, params=PARAMS,
                     train_time_s=1.0)
    ctl.credits.total = total
    for tag, n in (tags or {0: admitted}).items():
        if n:
            ctl.credits.record(tag, n)
    ctl.trainer.version = trainer_version
    for t in pending:
        t.state = State.PENDING
        ctl.trajectories[t.id] = t
        ctl.pending.add(t)
    for w in workers:
        for t in w.residents.values():
            ctl.trajectories[t.id] = t
    v = PoolView(0.0, trainer_version, next_batch, workers, ctl.pending, ctl.fresh, ctl.credits, PARAMS, False,
                 0, 0, {})
    v.controller = ctl
    return v


def actions(v):
    """Run one decision, applying each action as the controller would."""
    out = []
    for a in Cadence(PARAMS).decide(v):
        v.controller.apply(a, 0.0)
        out.append(a)
    return out


def test_pacing_evicts_the_longest_resident_of_a_worker_below_the_floor():
    a, b, c = traj(1, 3000), traj(2, 5000), traj(3, 1500)
    w = worker(0, cap=10_000, residents=[a, b, c])  # 9500 used: headroom 500 < floor 1000
    acts = actions(view([w, worker(1)], fresh=[traj(10, 10)]))
    assert acts[0] == Evict(2)


def test_pacing_places_shortest_first_by_tight_fit():
    full = worker(0, cap=10_000, residents=[traj(1, 7000)])
    empty = worker(1, cap=10_000)
    acts = actions(view([full, empty], fresh=[traj(10, 50, group=5)], admitted=100, batch=100, total=300))
    # fresh work goes to the nearly full worker (smallest post-placement headroom that stays feasible)
    assert acts == [Admit(0, 10)]


def test_pacing_respects_the_per_resident_decode_reserve():
    # 20 residents x delta 100 = 2000 reserved + floor 1000: a 7000-token worker has no room left
    residents = [traj(i, 350) for i in range(20)]
    crowded = worker(0, cap=10_000, residents=residents)
    roomy = worker(1, cap=10_000, residents=[traj(99, 1000)])
    acts = actions(view([crowded, roomy], fresh=[traj(100, 50)], admitted=100, batch=100, total=300))
    assert acts == [Admit(1, 100)]


def test_pacing_prefers_a_worker_holding_a_sibling():
    sib = traj(1, 2000, group=7)
    home = worker(0, cap=10_000, residents=[sib])
    tighter = worker(1, cap=10_000, residents=[traj(2, 6000)])
    p = traj(3, 500, group=7)
    acts = actions(view([home, tighter], pending=[p], admitted=200, batch=100, total=200))
    assert Place(3, 0) in acts


def test_concentration_places_longest_first_on_highest_affinity_then_headroom():
    hi_a = worker(0, cap=20_000, affinity=0, residents=[traj(1, 9000)])
    hi_b = worker(1, cap=20_000, affinity=0, residents=[traj(2, 2000)])
    lo = worker(2, cap=20_000, affinity=1)
    long_, short = traj(5, 6000), traj(6, 1000)
    # the budget for version 0 is spent (200 admitted, eta=1, batch 100)
    acts = actions(view([hi_a, hi_b, lo], pending=[short, long_], admitted=200, batch=100, total=200))
    assert acts[:2] == [Place(5, 1), Place(6, 1)]


def test_concentration_gate_blocks_draining_while_pending_is_not_empty():
    stuck = traj(5, 9500)  # fits nowhere
    src = worker(0, cap=10_000, affinity=1, residents=[traj(1, 500)])
    dst = worker(1, cap=10_000, affinity=0, residents=[traj(2, 500)])
    newer = worker(2, cap=10_000, affinity=0, version=1)
    v = view([src, dst, newer], pending=[stuck], fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100,
             total=400, next_batch=1)
    assert not any(isinstance(a, Evict) for a in actions(v))


def test_concentration_drains_the_lowest_affinity_worker_once_pending_is_empty():
    src = worker(0, cap=10_000, affinity=1, residents=[traj(1, 500), traj(2, 700)])
    dst = worker(1, cap=10_000, affinity=0, residents=[traj(3, 500)])
    newer = worker(2, cap=10_000, affinity=0, version=1)
    v = view([src, dst, newer], fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100, total=400,
             next_batch=1)
    acts = actions(v)
    assert acts[:2] == [Evict(2), Evict(1)]          # the source departs, longest first
    assert Place(2, 1) in acts and Place(1, 1) in acts  # onto the higher-affinity worker


def test_concentration_does_not_drain_when_nothing_newer_awaits():
    src = worker(0, cap=10_000, affinity=1, residents=[traj(1, 500)])
    dst = worker(1, cap=10_000, affinity=0, residents=[traj(3, 500)])
    acts = actions(view([src, dst], fresh=[traj(50, 20)], admitted=200, batch=100, total=400))  # trainer at v0
    assert not any(isinstance(a, Evict) for a in acts)


def test_a_drained_worker_joins_an_intermediate_version_holding_weaker_tail_work():
    strong = worker(0, cap=10_000, affinity=0, version=0)          # empty, can advance
    weak_tail = worker(1, cap=10_000, affinity=2, version=1, residents=[traj(1, 8000, version=1)])
    keeper = worker(2, cap=10_000, affinity=1, version=0, residents=[traj(2, 100)])
    # budget: versions 0 and 1 are spent, version 2 has fresh room
    v = view([strong, weak_tail, keeper], trainer_version=2, batch=100, total=1000, next_batch=2,
             tags={0: 100, 1: 200})
    assert Advance(0, 1) in actions(v)
