"""CadenceRL's decisions on hand-made pool views: the paper's rules, one at a time."""

from __future__ import annotations

import pytest

from cadencerl.core.actions import Admit, Advance, Evict, Place
from cadencerl.core.worker import Worker
from cadencerl.hardware import catalog
from cadencerl.hardware.perf import make_perf
from cadencerl.policies.cadence import Cadence
from cadencerl.policies.decode_share import DecodeRate
from tests.pools import cadence, pool, traj, worker


def view(workers, policy=None, now=0.0, **state):
    """A pool holding exactly this state, decided by `policy` (default: CadenceRL with PARAMS)."""
    p = pool(policy or cadence(), workers, **state)
    p.now = now
    return p


def actions(p, **options):
    """Run one decision (with CadenceRL's `options` changed, if any), applying each action as the controller would."""
    if options:
        p.policy = p.controller.policy = cadence(**options)
    return p.decide()


def test_pacing_evicts_the_longest_resident_of_a_worker_below_the_floor():
    a, b, c = traj(1, 3000), traj(2, 5000), traj(3, 1500)
    w = worker(0, cap=10_000, residents=[a, b, c])  # 9500 used: headroom 500 < floor 1000
    acts = actions(view([w, worker(1)], fresh=[traj(10, 10)]))
    assert acts[0] == Evict(2)


def test_pacing_places_shortest_first_by_tight_fit_while_kv_binds():
    full = worker(0, cap=10_000, residents=[traj(1, 7000)])
    empty = worker(1, cap=10_000)
    waiting = traj(20, 9500)  # pending and fits nowhere: KV binds
    acts = actions(view([full, empty], pending=[waiting], fresh=[traj(10, 50, group=5)], admitted=100, batch=100,
                        total=300))
    # fresh work goes to the nearly full worker (smallest post-placement headroom that stays feasible)
    assert acts == [Admit(0, 10)]


def test_pacing_spreads_to_the_least_loaded_worker_when_nothing_is_pending():
    full = worker(0, cap=10_000, residents=[traj(1, 7000), traj(2, 100), traj(4, 100)])
    light = worker(1, cap=10_000, residents=[traj(3, 100)])  # fewer residents: it takes both
    fresh = [traj(10, 50, group=5), traj(11, 50, group=6)]
    acts = actions(view([full, light], fresh=fresh, admitted=100, batch=100, total=300))
    assert acts == [Admit(1, 10), Admit(1, 11)]
    acts = actions(view([worker(0, cap=10_000, residents=[traj(1, 7000), traj(2, 100)]),
                         worker(1, cap=10_000, residents=[traj(3, 100)])],
                        fresh=[traj(10, 50, group=5)], admitted=100, batch=100, total=300),
                   spread={"when_underloaded": False})
    assert acts == [Admit(0, 10)]  # the option off: tight fit always


def test_the_decode_reserve_counts_once_per_placement_not_per_resident():
    # 20 residents, 7000 used: headroom 3000 - 50 clears floor 1000 + delta 100 once (not 1000 + 20 x 100)
    crowded = worker(0, cap=10_000, residents=[traj(i, 350) for i in range(20)])
    roomy = worker(1, cap=10_000, residents=[traj(99, 1000)])
    acts = actions(view([crowded, roomy], pending=[traj(98, 9900)], fresh=[traj(100, 50)], admitted=100,
                        batch=100, total=300))
    assert acts == [Admit(0, 100)]
    tight = worker(0, cap=10_000, residents=[traj(i, 445) for i in range(20)])  # 8900 used: 1100 - 50 < 1100
    acts = actions(view([tight, worker(1, cap=10_000, residents=[traj(99, 1000)])], pending=[traj(98, 9900)],
                        fresh=[traj(100, 50)], admitted=100, batch=100, total=300))
    assert acts == [Admit(1, 100)]


def test_the_floor_covers_growth_until_the_next_decision():
    # residents grow 24 tokens/s each; at a 0.5 s tick, 10 residents add 120 tokens before the next decision
    policy = cadence()
    residents = [traj(i, 880) for i in range(10)]             # 8800 used, headroom 1200 >= floor 1000
    w = worker(0, cap=10_000, residents=residents)
    assert actions(view([w, worker(1)], policy, fresh=[traj(50, 10)], admitted=100, batch=100, total=300)) \
        == [Admit(1, 50)]
    for t in residents:
        t.tokens += 12                                         # 0.5 s later: 120 more tokens, headroom 1080
    w.kv_used += 120
    acts = actions(view([w, worker(1, residents=[traj(60, 10)])], policy, now=0.5, admitted=101, batch=100,
                        total=300))
    assert acts and acts[0] == Evict(max(residents, key=lambda t: t.context).id)  # 1080 < 1000 + 10 x 12 growth


def test_pacing_prefers_a_worker_holding_a_sibling():
    policy = cadence()
    sib = traj(1, 50, group=7)
    acts = actions(view([worker(0, cap=10_000), worker(1, cap=10_000, residents=[traj(2, 6000)])], policy,
                        fresh=[sib], admitted=100, batch=100, total=300))
    assert acts == [Admit(0, 1)]                      # spread: the empty worker, now the prompt's home
    home = worker(0, cap=10_000, residents=[traj(1, 2000, group=7)])
    tighter = worker(1, cap=10_000, residents=[traj(2, 6000)])
    stuck, p = traj(9, 9950), traj(3, 500, group=7)   # KV binds: tight fit would take worker 1
    acts = actions(view([home, tighter], policy, pending=[p, stuck], admitted=101, batch=100, total=300))
    assert Place(3, 0) in acts


def test_concentration_places_longest_first_on_highest_affinity_then_headroom():
    hi_a = worker(0, cap=20_000, rank=0, residents=[traj(1, 9000)])
    hi_b = worker(1, cap=20_000, rank=0, residents=[traj(2, 2000)])
    lo = worker(2, cap=20_000, rank=1)
    long_, short = traj(5, 6000), traj(6, 1000)
    # the budget for version 0 is spent (200 admitted, eta=1, batch 100)
    acts = actions(view([hi_a, hi_b, lo], pending=[short, long_], admitted=200, batch=100, total=200))
    assert acts[:2] == [Place(5, 1), Place(6, 1)]


def test_concentration_gate_blocks_draining_while_pending_is_not_empty():
    stuck = traj(5, 9500)  # fits nowhere
    src = worker(0, cap=10_000, rank=1, residents=[traj(1, 500)])
    dst = worker(1, cap=10_000, rank=0, residents=[traj(2, 500)])
    newer = worker(2, cap=10_000, rank=0, version=1)
    v = view([src, dst, newer], pending=[stuck], fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100,
             total=400)
    assert not any(isinstance(a, Evict) for a in actions(v))


def test_concentration_drains_the_lowest_affinity_worker_once_pending_is_empty():
    # the newer version's only worker is full: fresh work waits for a drained worker
    src = worker(0, cap=10_000, rank=1, residents=[traj(1, 500), traj(2, 700)])
    dst = worker(1, cap=10_000, rank=0, residents=[traj(3, 500)])
    newer = worker(2, cap=10_000, rank=0, version=1, residents=[traj(40, 8900, version=1)])
    v = view([src, dst, newer], fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100, total=400)
    acts = actions(v, drain={"needs_kv_bind": False})
    assert acts[:2] == [Evict(2), Evict(1)]          # the source departs, longest first
    assert Place(2, 1) in acts and Place(1, 1) in acts  # onto the higher-affinity worker


def test_concentration_does_not_drain_when_nothing_newer_awaits():
    def pool():
        return [worker(0, cap=10_000, rank=1, residents=[traj(1, 500)]),
                worker(1, cap=10_000, rank=0, residents=[traj(3, 500)])]
    acts = actions(view(pool(), fresh=[traj(50, 20)], admitted=200, batch=100, total=400))  # trainer at v0
    assert not any(isinstance(a, Evict) for a in acts)
    acts = actions(view(pool(), fresh=[traj(50, 20)], admitted=200, batch=100, total=400),
                   drain={"needs_fresh_ahead": False, "needs_kv_bind": False})  # the paper's gate alone
    assert acts == [Evict(1), Place(1, 1)]


def test_whole_source_gate_keeps_a_source_that_the_targets_cannot_absorb():
    def pool():
        return [worker(0, cap=10_000, rank=1, residents=[traj(1, 5500), traj(2, 500)]),
                worker(1, cap=10_000, rank=0, residents=[traj(3, 4000)]),
                worker(2, cap=10_000, rank=0, version=1, residents=[traj(40, 8900, version=1)])]
    def state():
        return view(pool(), fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100, total=400)
    acts = actions(state(), drain={"needs_kv_bind": False})  # paper: drain, place what fits, leave the rest pending
    assert acts[:2] == [Evict(1), Evict(2)] and Place(2, 1) in acts and Place(1, 1) not in acts
    acts = actions(state(), drain={"whole_source": True, "needs_kv_bind": False})
    assert not any(isinstance(a, Evict) for a in acts)


def test_concentration_waits_until_kv_has_bound_under_the_version():
    def state(policy):
        return view([worker(0, cap=10_000, rank=1, residents=[traj(1, 500), traj(2, 700)]),
                     worker(1, cap=10_000, rank=0, residents=[traj(3, 500)]),
                     worker(2, cap=10_000, rank=0, version=1, residents=[traj(40, 8900, version=1)])],
                    policy, fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100, total=400)
    policy = cadence()
    assert not any(isinstance(a, Evict) for a in actions(state(policy)))  # never bound: workers drain by themselves
    crowded = worker(0, cap=10_000, residents=[traj(10, 5000), traj(11, 4500)])  # 500 free < floor 1000
    actions(view([crowded, worker(1)], policy, fresh=[traj(60, 10)], admitted=100, batch=100, total=300))
    assert policy.kv_bound == {0}
    assert actions(state(policy))[:2] == [Evict(2), Evict(1)]  # bound under version 0: its tail concentrates


def test_a_drained_worker_joins_an_intermediate_version_holding_weaker_tail_work_it_may_drain():
    def advance(bound: set[int]):
        policy = cadence()
        policy.paced_bound |= bound
        strong = worker(0, cap=10_000, rank=0, version=0)          # empty, can advance
        weak_tail = worker(1, cap=10_000, rank=2, version=1, residents=[traj(1, 8000, version=1)])
        keeper = worker(2, cap=10_000, rank=1, version=0, residents=[traj(2, 100)])
        # budget: versions 0 and 1 are spent, version 2 has fresh room
        v = view([strong, weak_tail, keeper], policy, trainer_version=2, batch=100, total=1000,
                 tags={0: 100, 1: 200})
        return next(a for a in actions(v) if isinstance(a, Advance) and a.worker == 0)

    assert advance({1}) == Advance(0, 1)   # KV bound under 1 while it paced: its tail will drain onto it
    assert advance(set()) == Advance(0, 2)   # it would not drain: the newest version, with fresh work


def test_the_room_index_answers_tight_fit_and_least_loaded():
    from cadencerl.policies.cadence_rooms import RoomIndex, RoomTerms

    ws = [worker(0, residents=[traj(1, 6000)]), worker(1, residents=[traj(2, 100), traj(3, 100)]), worker(2)]
    index = RoomIndex(RoomTerms.read(ws, {}, 0.0, 1.0))   # no floor, no growth: the room is the headroom
    assert index.tightest(3000) is ws[0] and index.tightest(9900) is ws[2] and index.tightest(20_000) is None
    assert index.least_loaded(100) is ws[2] and index.least_loaded(9900) is ws[2]
    index.place(ws[2], 9950)
    assert index.load(ws[2]) == 1 and index.candidate(2, 51) is None and index.candidate(2, 50) is ws[2]
    assert index.least_loaded(100) is ws[0] and index.tightest(60) is ws[0]


def test_group_affinity_keeps_a_prompts_samples_together_while_it_can():
    from cadencerl.policies.base import GroupAffinity

    ws = [worker(0), worker(1), worker(2)]
    pick = GroupAffinity().wrap(lambda cands, _t: min(cands, key=lambda w: (w.load, w.id)))
    ws[0].residents[99] = traj(99, 10)
    first = pick(ws, traj(1, 10, group=7))
    assert first is ws[1]
    assert pick(ws, traj(2, 10, group=7)) is ws[1]          # the sibling follows
    assert pick([ws[0], ws[2]], traj(3, 10, group=7)) is ws[2]  # not a candidate any more: the chooser decides


def test_no_drain_while_the_newer_versions_workers_take_the_fresh_work():
    src = worker(0, cap=10_000, rank=1, residents=[traj(1, 500), traj(2, 700)])
    dst = worker(1, cap=10_000, rank=0, residents=[traj(3, 500)])
    newer = worker(2, cap=10_000, rank=0, version=1)  # empty: it admits the fresh work first
    acts = actions(view([src, dst, newer], fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100,
                        total=400), drain={"needs_kv_bind": False})
    assert acts == [Admit(2, 50)]


def test_while_spreading_the_prompts_home_only_breaks_a_tie_among_the_least_loaded():
    def decide(**options):
        busy = worker(0, cap=10_000, residents=[traj(i, 100) for i in range(1, 7)])       # 6 residents
        light = worker(1, cap=10_000, residents=[traj(7, 100)])                           # 1
        idle = worker(2, cap=10_000, residents=[traj(8, 100)])                            # 1
        siblings = [traj(10 + i, 50, group=5) for i in range(4)]
        return actions(view([busy, light, idle], fresh=siblings, admitted=100, batch=100, total=300), **options)

    # the default while KV has not bound (and `cadence-balanced-spread` always): least-loaded's
    # choice, the home breaking its ties: the second sample leaves the first (2 > 1 on worker 2),
    # the third ties the least loaded (2 = 2) and stays with its sibling, the fourth leaves again
    balanced = [Admit(1, 10), Admit(2, 11), Admit(2, 12), Admit(1, 13)]
    assert decide() == balanced
    assert decide(spread={"home_first_when": "never"}) == balanced
    # up to the mean (8 residents over 3 workers, then 9, 10, 11): the first sample goes to the
    # least-loaded worker, the second follows it (2 + 1 <= 9/3), the third would make its home a
    # hot spot (3 + 1 > 10/3) and goes to the least-loaded worker, the fourth ties it (2 = 2) and
    # so stays with its sibling there
    capped = [Admit(1, 10), Admit(1, 11), Admit(2, 12), Admit(2, 13)]
    assert decide(spread={"home": "capped", "home_first_when": "never"}) == capped
    assert decide(spread={"home": "capped", "home_first_when": "kv-binds"}) == capped
    # home first (`cadence-home-first`, or the default once KV has bound): every sibling follows the first
    assert decide(spread={"home": "first"}) == [Admit(1, 10), Admit(1, 11), Admit(1, 12), Admit(1, 13)]


def _decide_after_binds(bound: set[int], version: int = 0, **options) -> list:
    """Four samples of one prompt admitted under `version`, KV having bound under the versions `bound`."""
    policy = cadence(**options)
    policy.kv_bound |= bound
    busy = worker(0, cap=10_000, version=version, residents=[traj(i, 100, version=version) for i in range(1, 7)])
    light = worker(1, cap=10_000, version=version, residents=[traj(7, 100, version=version)])
    idle = worker(2, cap=10_000, version=version, residents=[traj(8, 100, version=version)])
    siblings = [traj(10 + i, 50, group=5) for i in range(4)]
    return actions(view([busy, light, idle], policy, fresh=siblings, trainer_version=version,
                        tags={version: 100}, consumed=100 * version, batch=100, total=100 * version + 300))


_HOME_FIRST = [Admit(1, 10), Admit(1, 11), Admit(1, 12), Admit(1, 13)]
_BALANCED = [Admit(1, 10), Admit(2, 11), Admit(2, 12), Admit(1, 13)]


def test_the_prompts_home_is_taken_whenever_feasible_only_once_kv_has_bound_under_two_versions_in_a_row():
    # the default: KV bound under the version and the one before it, or under the two before it
    assert _decide_after_binds({3, 4}, version=4) == _HOME_FIRST
    assert _decide_after_binds({2, 3}, version=4) == _HOME_FIRST
    assert _decide_after_binds({0}, version=0) == _HOME_FIRST      # version 0 has no version before it
    assert _decide_after_binds({0}, version=1) == _HOME_FIRST
    # a bind in one version only (the tail of the one before, or this one's own) is a transient:
    # the home only breaks a tie among the least loaded
    assert _decide_after_binds({3}, version=4) == _BALANCED
    assert _decide_after_binds({4}, version=4) == _BALANCED
    assert _decide_after_binds({1, 3}, version=4) == _BALANCED
    assert _decide_after_binds({2, 3}, version=5) == _BALANCED     # two in a row, but no longer recent
    assert _decide_after_binds(set(), version=4) == _BALANCED
    # the previous default (`cadence-any-bind`) takes the home after any bind under the version or the one before
    assert _decide_after_binds({3}, version=4, spread={"home_first_when": "kv-binds"}) == _HOME_FIRST


def test_once_kv_has_bound_under_the_version_or_the_one_before_the_prompts_home_is_taken_whenever_feasible():
    def decide(bound: set[int], version: int = 0, **options):
        return _decide_after_binds(bound, version, **{"spread": {"home_first_when": "kv-binds"}, **options})

    home_first, balanced = _HOME_FIRST, _BALANCED
    assert decide({0}) == home_first
    assert decide({0}, version=1) == home_first                 # bound under the version before
    assert decide({0}, version=2) == balanced                   # two versions ago: least-loaded again
    assert decide(set()) == balanced
    capped = [Admit(1, 10), Admit(1, 11), Admit(2, 12), Admit(2, 13)]
    assert decide({0}, spread={"home": "capped", "home_first_when": "kv-binds"}) == home_first
    assert decide(set(), spread={"home": "capped", "home_first_when": "kv-binds"}) == capped


def test_a_version_on_one_affinity_rank_keeps_pacing_after_its_budget_is_spent():
    def state():
        # one rank, budget of version 0 spent, KV has bound under it, a newer version waits with fresh work
        src = worker(0, cap=10_000, residents=[traj(1, 500), traj(2, 700)])
        dst = worker(1, cap=10_000, residents=[traj(3, 1500)])
        newer = worker(2, cap=10_000, version=1, residents=[traj(40, 8900, version=1)])
        return view([src, dst, newer], fresh=[traj(50, 20)], trainer_version=1, admitted=150, batch=100, total=400)

    assert not any(isinstance(a, Evict) for a in actions(state(), drain={"needs_kv_bind": False}))
    # the option on: the emptier worker drains onto the fuller one of the same rank
    acts = actions(state(), drain={"needs_kv_bind": False, "within_one_rank": True})
    assert acts[:2] == [Evict(2), Evict(1)] and Place(2, 1) in acts and Place(1, 1) in acts


def test_a_fair_share_keeps_the_first_worker_at_a_version_from_taking_its_whole_budget():
    def admitted(bound: frozenset[int] = frozenset(), **options) -> int:
        policy = cadence(**options)
        policy.kv_bound |= bound
        old = [worker(i, cap=10_000, residents=[traj(10 * i + j, 100) for j in range(1, 4)]) for i in (1, 2)]
        lone = worker(0, cap=10_000, version=1)   # the first to reach version 1; the others run version 0's tail
        fresh = [traj(100 + i, 50, group=100 + i) for i in range(12)]
        acts = actions(view([lone, *old], policy, fresh=fresh, trainer_version=1, tags={0: 100}, consumed=100,
                            batch=100, total=400))
        assert all(a.worker == 0 for a in acts)
        return len(acts)

    assert admitted(spread={"fair_share": 0.0}) == 12         # no share: the whole admissible budget
    # 6 residents + 12 admissible over 3 workers of equal KV: a share of 6, held from 7 on
    assert admitted(spread={"fair_share": 1.0}) == 7
    assert admitted() == 10                              # the default, 1.5: held from int(1.5 x 6) + 1 on
    assert admitted(spread={"fair_share": 2.0}) == 12         # twice the share (13) exceeds the budget
    # once KV has stayed bound (two versions in a row) every version binds: no share is kept
    assert admitted(frozenset({0, 1}), spread={"fair_share": 1.0}) == 12


def test_fresh_work_goes_on_to_a_larger_worker_under_its_share_once_the_least_loaded_holds_its_own():
    policy = cadence(spread={"fair_share": 1.0})
    old = [worker(i, cap=10_000, residents=[traj(10 * i + j, 100) for j in range(1, 4)]) for i in (1, 2)]
    small = worker(0, cap=10_000, version=1)
    large = worker(3, cap=30_000, version=1, residents=[traj(40 + j, 100, group=40 + j) for j in range(5)])
    fresh = [traj(100 + i, 50, group=100 + i) for i in range(12)]
    acts = actions(view([small, *old, large], policy, fresh=fresh, trainer_version=1, tags={0: 100}, consumed=100,
                        batch=100, total=400))
    # 11 residents + 12 admissible over 4 workers: 6 each at the mean KV, so 4 for the small worker
    # and 12 for the one with three times its KV (already holding 5)
    assert sum(a.worker == 0 for a in acts) == 4
    assert sum(a.worker == 3 for a in acts) == 7


def test_with_the_pacing_bind_option_a_shed_while_concentrating_does_not_start_a_drain():
    def state(policy):
        # version 0's budget is spent (150 started under it), version 1's only worker is full while fresh
        # work waits; the weaker worker's tail has outgrown it (9500 used: 500 free < floor 1000)
        crowded = worker(0, cap=10_000, rank=1, residents=[traj(1, 5000), traj(2, 4500)])
        roomy = worker(1, cap=10_000, rank=0, residents=[traj(3, 500)])
        newer = worker(2, cap=10_000, rank=0, version=1, residents=[traj(40, 8900, version=1)])
        return view([crowded, roomy, newer], policy, fresh=[traj(50, 20)], trainer_version=1, admitted=150,
                    batch=100, total=400)

    counted = cadence(drain={"bind_while_pacing": False})
    # long out, up the affinity order; the shed counts as a bind, so the rest of the worker drains too
    # (its last resident stays pending: no room for it) and the emptied worker advances
    assert actions(state(counted)) == [Evict(1), Place(1, 1), Evict(2), Advance(0, 1)]
    assert counted.kv_bound == {0} and counted.paced_bound == set()
    paced = cadence(drain={"bind_while_pacing": True})
    assert actions(state(paced)) == [Evict(1), Place(1, 1)]   # the same shed, no drain
    assert paced.kv_bound == {0} and paced.paced_bound == set()
    # a shed while version 0 paced (its fresh work not yet spent) lets the drain go ahead
    crowded = worker(0, cap=10_000, residents=[traj(10, 5000), traj(11, 4500)])
    actions(view([crowded, worker(1)], paced, fresh=[traj(60, 10)], admitted=100, batch=100, total=300))
    assert paced.paced_bound == {0}
    assert actions(state(paced)) == [Evict(1), Place(1, 1), Evict(2), Advance(0, 1)]


def test_a_prompts_home_holding_its_share_passes_fresh_work_on_even_when_it_ties_the_least_loaded():
    policy = cadence(spread={"fair_share": 1.0})
    old = [worker(i, cap=10_000, residents=[traj(10 * i + j, 100) for j in range(1, 4)]) for i in (1, 2)]
    home = worker(0, cap=10_000, version=1, residents=[traj(30 + j, 100, group=30 + j) for j in range(4)])
    large = worker(3, cap=30_000, version=1, residents=[traj(40 + j, 100, group=40 + j) for j in range(4)])
    policy.homes.note(7, home.id)
    # 14 residents + 1 admissible over 4 workers: a share of 4 at the mean KV, so 2.7 for the home (holding
    # 4) and 8 for the worker with three times its KV; both hold 4, so the home would take the tie
    acts = actions(view([home, *old, large], policy, fresh=[traj(100, 50, group=7)], trainer_version=1,
                        tags={0: 100}, consumed=100, batch=100, total=400))
    assert acts == [Admit(3, 100)]


def test_a_growth_window_keeps_a_burst_counted_a_millisecond_later_from_reading_as_the_rate():
    # A router counts tokens as its reads bring them: 12 tokens counted 1 ms after the last decision
    # would read as 12,000 tokens/s. With a window, the measurement waits until it spans a tick.
    bursty, windowed = cadence(), cadence(growth_window_s=0.5)
    for policy in (bursty, windowed):
        t = traj(0, 100)
        w = worker(0, residents=[t])
        actions(view([w], policy))
        t.tokens += 12
        actions(view([w], policy, now=0.001))
        t.tokens += 12                         # 24 tokens over the half second: 48 tokens/s
        actions(view([w], policy, now=0.5))
    assert bursty.growth.rates[0] > 5_000      # the burst read as the rate (halved once since)
    assert windowed.growth.rates[0] == 48.0    # one measurement over the whole span


def test_live_servers_measure_growth_over_a_tick_unless_the_scenario_says_otherwise():
    from cadencerl.config import builtin_scenario
    from cadencerl.runs.registry import live_scenario

    s = builtin_scenario("cpu-hetero")
    assert s.cadence.growth_window_s is None                                      # the simulator: every decision
    assert live_scenario(s).cadence.growth_window_s == s.controller.tick_s
    assert live_scenario(s.with_knobs(delta=64)).cadence.growth_window_s == s.controller.tick_s   # an override keeps it
    assert live_scenario(s.with_overrides(cadence={"growth_window_s": 0.0})).cadence.growth_window_s == 0.0


class FixedRates(DecodeRate):
    """Decode rates given per worker id (None: no perf model for that worker)."""

    def __init__(self, rates: dict[int, float | None]) -> None:
        super().__init__({})
        self.rates = rates

    def __call__(self, w, context: int) -> float | None:
        return self.rates[w.id]


def test_a_decode_weighted_share_follows_what_a_worker_decodes_not_what_it_holds():
    def placed(rates: dict[int, float | None] | None, share_by: str = "decode") -> dict[int, int]:
        policy = Cadence(cadence(spread={"fair_share": 1.0, "share_by": share_by}).params, 1.0,
                         decode_rate=None if rates is None else FixedRates(rates))
        old = [worker(i, cap=10_000, residents=[traj(10 * i + j, 100) for j in range(1, 4)]) for i in (1, 2)]
        small = worker(0, cap=10_000, version=1)
        large = worker(3, cap=30_000, version=1, residents=[traj(40 + j, 100, group=40 + j) for j in range(5)])
        fresh = [traj(100 + i, 50, group=100 + i) for i in range(12)]
        acts = actions(view([small, *old, large], policy, fresh=fresh, trainer_version=1, tags={0: 100},
                            consumed=100, batch=100, total=400))
        return {wid: sum(a.worker == wid for a in acts) for wid in (0, 3)}

    by_kv = {0: 4, 3: 7}     # shares of 6 at the mean weight: 4 for the small worker, 12 for the large one
    assert placed(None, "kv") == by_kv
    # the small worker decodes three times what each other one does: its share is 12, the large one's 4
    # (already held 5 times over), so the whole budget goes to the small one
    assert placed({0: 3.0, 1: 1.0, 2: 1.0, 3: 1.0}) == {0: 12, 3: 0}
    assert placed({0: 3.0, 1: 1.0, 2: 1.0, 3: None}) == by_kv        # a worker without a model: KV
    assert placed({0: 3.0, 1: 1.0, 2: 1.0, 3: 1.0}, "kv") == by_kv   # the option off: the rates are unused
    assert placed(None) == by_kv                                     # no rates given: KV


def test_decode_rate_is_a_full_worker_over_its_step_time_by_the_catalog():
    model = catalog.model("tiny")
    fast, slow = (make_perf(catalog.accelerator(a), model, 1) for a in ("cpu-fast", "cpu-slow"))
    rate = DecodeRate({("cpu-fast", 1): fast, ("cpu-slow", 1): slow})
    small_fast = Worker(0, "cpu-fast", "local", 1, 4096, 32, 0)
    large_slow = Worker(1, "cpu-slow", "local", 1, 16384, 64, 1)
    # KV bounds the fast worker at 512 tokens a context (8 of them), its 32 slots at 64; a step reads
    # every resident's context
    assert rate(small_fast, 512) == pytest.approx(8 / fast.decode_step_time(8, 8 * 512))
    assert rate(small_fast, 64) == pytest.approx(32 / fast.decode_step_time(32, 32 * 64))
    assert rate(Worker(2, "H800", "x", 1, 4096, 32, 0), 512) is None           # no model for it
    # the pair CadenceRL trailed on: four times the KV, still less decoded at every context
    assert all(rate(small_fast, c) > rate(large_slow, c) for c in (64, 256, 512, 1024))
