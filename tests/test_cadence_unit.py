"""CadenceRL's decisions on hand-made pool views: the paper's rules, one at a time."""

from __future__ import annotations

from cadencerl.core.actions import Admit, Advance, Evict, Place
from cadencerl.policies.cadence import Cadence
from tests.pools import PARAMS, pool, traj, worker


def view(workers, **state):
    """A pool holding exactly this state, decided by CadenceRL."""
    return pool(Cadence(PARAMS), workers, **state)


def actions(p):
    """Run one decision, applying each action as the controller would."""
    return p.decide()


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
             total=400)
    assert not any(isinstance(a, Evict) for a in actions(v))


def test_concentration_drains_the_lowest_affinity_worker_once_pending_is_empty():
    src = worker(0, cap=10_000, affinity=1, residents=[traj(1, 500), traj(2, 700)])
    dst = worker(1, cap=10_000, affinity=0, residents=[traj(3, 500)])
    newer = worker(2, cap=10_000, affinity=0, version=1)
    v = view([src, dst, newer], fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100, total=400)
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
    v = view([strong, weak_tail, keeper], trainer_version=2, batch=100, total=1000, tags={0: 100, 1: 200})
    assert Advance(0, 1) in actions(v)
