"""The MISA-T gate on hand-built views, one rule at a time: the capacity ramp, the pressure signal
(tool-held KV included), the class deficit with its completion-time lead, quota lending, and
continuations (never held; back home unless the home is overloaded)."""

from __future__ import annotations

import dataclasses

import pytest

from cadencerl.admission.misa import DECREASE, HIGH, INITIAL_SCALE, MAX_CAP_FACTOR, SHARE_EWMA, Admitted, MisaT
from cadencerl.admission.misa_learn import PRIOR_REPLY, WARMUP, ClassStats
from cadencerl.core.actions import Admit, Place
from cadencerl.core.trajectory import State
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.policies.routers import LeastLoadedRouter
from tests.pools import cadence, pool, traj, worker

MIX = {"agent": 0.5, "rlhf": 0.5}


def fresh(n, cls="rlvr", start=100, prompt=10):
    return [traj(i, prompt, prompt=prompt, cls=cls) for i in range(start, start + n)]


def loaded(wid, n, start=None, ctx=10, **kw):
    base = 1000 * (wid + 1) if start is None else start
    return worker(wid, residents=[traj(i, ctx) for i in range(base, base + n)], **kw)


def warm(misa, cls, footprint, duration):
    misa.learner.stats[cls] = ClassStats(footprint, duration, WARMUP)


# -- ramp: the first cap is the capacity estimate, then pressure corrects it -------------------------

def test_the_first_cap_is_the_kv_budget_over_a_sessions_footprint_not_a_slow_start():
    misa = MisaT({"rlvr": 1.0})
    misa.observe(pool(LeastLoaded(), [worker(0, cap=100_000)], fresh=fresh(1)).view)
    assert misa.caps[0] == pytest.approx(INITIAL_SCALE * HIGH * 100_000 / (10 + PRIOR_REPLY))


def test_before_any_session_finished_a_request_s_max_tokens_bounds_the_reply_prior():
    """A request that may add only 64 tokens is not sized as a 1,024-token reply (the live router's
    first rounds held most sessions of a pool under no pressure); without max_tokens the prior stays."""
    def first_cap(*hints):
        waiting = fresh(len(hints))
        for t, hint in zip(waiting, hints):
            t.spec = dataclasses.replace(t.spec, max_new_tokens=hint)
        misa = MisaT({"rlvr": 1.0})
        misa.observe(pool(LeastLoaded(), [worker(0, cap=100_000, seqs=10_000)], fresh=waiting).view)
        return misa.caps[0]

    per_footprint = INITIAL_SCALE * HIGH * 100_000
    assert first_cap(64) == pytest.approx(per_footprint / (10 + 64))
    assert first_cap(64, 512) == pytest.approx(per_footprint / (10 + 512)), "the longest the class may add"
    assert first_cap(64, None) == pytest.approx(per_footprint / (10 + PRIOR_REPLY)), "one names none"
    assert first_cap(4096) == pytest.approx(per_footprint / (10 + PRIOR_REPLY)), "a bound, not a guess"


def test_the_capacity_estimate_weights_each_class_by_how_long_it_holds_its_kv():
    misa = MisaT(MIX)
    warm(misa, "agent", footprint=4000, duration=300)
    warm(misa, "rlhf", footprint=1000, duration=30)
    misa.observe(pool(LeastLoaded(), [worker(0, cap=1_000_000, seqs=10_000)]).view)
    per_session = (0.5 * 300 * 4000 + 0.5 * 30 * 1000) / (0.5 * 300 + 0.5 * 30)
    assert misa.caps[0] == pytest.approx(INITIAL_SCALE * HIGH * 1_000_000 / per_session)


@pytest.mark.parametrize("signal", ["preempted", "waiting"])
def test_pressure_shrinks_the_cap_multiplicatively(signal):
    misa = MisaT({"rlvr": 1.0})
    w = worker(0, cap=100_000)
    misa.observe(pool(LeastLoaded(), [w], fresh=fresh(1)).view)
    first = misa.caps[0]
    if signal == "preempted":
        w.preemptions += 1
    else:
        w.num_waiting = 3
    p = pool(LeastLoaded(), [w], fresh=fresh(1))
    p.now = 1.0
    misa.observe(p.view)
    assert misa.caps[0] == pytest.approx(first * DECREASE)


def test_lasting_pressure_takes_the_cap_to_decrease_of_the_sessions_in_flight_not_below():
    """Anti-windup: sessions grow as they age, so KV use can stay over HIGH long after the last
    admission. A cap already under the sessions in flight admits nothing; shrinking it further
    would only keep the pool empty once the pressure ends."""
    misa = MisaT({"rlvr": 1.0})
    warm(misa, "rlvr", footprint=500, duration=10)    # capacity estimate 9000 / 500 = 18 at scale 1
    busy = loaded(0, 10, cap=10_000)
    busy.engine_kv = 9_500                             # 95% use: over HIGH, and it lasts
    misa.observe(pool(LeastLoaded(), [busy], fresh=fresh(1)).view)   # first cap 0.5 x 18 = 9 < 10 sessions
    caps = []
    for t in range(1, 6):
        p = pool(LeastLoaded(), [busy], fresh=fresh(1))
        p.now = float(t)
        misa.observe(p.view)
        caps.append(misa.caps[0])
    assert caps[0] == pytest.approx(DECREASE * 10)     # one decrease, to DECREASE of the 10 in flight
    assert caps[-1] == pytest.approx(DECREASE * 10)    # then held while the pressure lasts
    busy.residents = dict(list(busy.residents.items())[:5])
    busy.sessions = 5                                  # half finished, use still over HIGH
    for t in range(6, 12):
        p.now = float(t)
        misa.observe(p.view)
    assert misa.caps[0] == pytest.approx(DECREASE * 5)  # the cap follows what is in flight down


def test_a_measured_cap_in_use_under_low_kv_use_grows_but_an_unused_one_does_not():
    misa = MisaT({"rlvr": 1.0})
    warm(misa, "rlvr", footprint=500, duration=10)   # measured: first cap 0.5 x 9000 / 500 = 9
    w = worker(0, cap=10_000)
    misa.observe(pool(LeastLoaded(), [w], fresh=fresh(1)).view)
    first = misa.caps[0]
    p = pool(LeastLoaded(), [w], fresh=fresh(1))
    p.now = 1.0
    misa.observe(p.view)
    assert misa.caps[0] == pytest.approx(first)    # unused: no growth
    busy = loaded(0, 10, cap=10_000)
    busy.engine_kv = 1000                          # 10% use with its cap in use
    p = pool(LeastLoaded(), [busy], fresh=fresh(1))
    p.now = 2.0
    misa.observe(p.view)
    assert misa.caps[0] == pytest.approx(first / DECREASE)   # one bounded step toward TARGET use


def test_before_every_class_is_measured_a_cap_in_use_does_not_grow():
    misa = MisaT({"rlvr": 1.0})
    misa.observe(pool(LeastLoaded(), [worker(0, cap=100_000)], fresh=fresh(1)).view)
    first = misa.caps[0]
    busy = loaded(0, int(first) + 1, cap=100_000)
    busy.engine_kv = 1000
    p = pool(LeastLoaded(), [busy], fresh=fresh(1))
    p.now = 1.0
    misa.observe(p.view)
    assert misa.caps[0] <= first                   # KV use lags admissions: no growth on a guess


def test_kv_held_across_a_tool_wait_counts_as_pressure():
    misa = MisaT({"rlvr": 1.0})
    w = worker(0, cap=10_000)
    w.engine_kv = 1000                              # the engine alone reports 10%
    misa.observe(pool(LeastLoaded(), [w], fresh=fresh(1)).view)
    away = traj(7, 9000)                            # a session between turns, its prefix cached on 0
    away.state, away.home = State.TOOL, 0
    misa.learner.track(away)
    p = pool(LeastLoaded(), [w], fresh=fresh(1))
    p.now = 1.0
    misa.observe(p.view)
    assert misa.scale[0] == pytest.approx(INITIAL_SCALE * DECREASE)   # 10% + 90% held: over HIGH


def running_batch_pool(inner, engine_share, sessions=10):
    """8 running slots and KV for far more: 5 sessions at the engine, the others on tools."""
    misa = MisaT({"rlvr": 1.0})
    warm(misa, "rlvr", footprint=100, duration=10)    # KV estimate: 0.5 x 0.9 x 1e6 / 100 = 4,500
    misa.engine_share = engine_share
    w = loaded(0, 5, cap=1_000_000, seqs=8)
    w.sessions = sessions
    return misa, pool(Admitted(misa, inner), [w], fresh=fresh(1))


def test_in_front_of_a_router_the_cap_is_the_sessions_that_fill_high_of_the_running_batch():
    """Little's law on the observed share at the engine: 8 slots x HIGH / half = 14.4 sessions, far
    under the KV estimate; past it the engine queues and the queued prefixes are evicted first."""
    misa, p = running_batch_pool(LeastLoadedRouter(), engine_share=0.5)
    misa.observe(p.view)
    assert misa.engine_share == pytest.approx(0.5)     # observed 5 of 10: unchanged
    assert misa.caps[0] == pytest.approx(HIGH * 8 / 0.5)


def test_the_share_at_the_engine_is_observed_and_smoothed():
    misa, p = running_batch_pool(LeastLoadedRouter(), engine_share=1.0)
    misa.observe(p.view)
    assert misa.engine_share == pytest.approx(1.0 - SHARE_EWMA * 0.5)   # one look toward 5 of 10


def test_the_running_batch_bound_is_a_routers_only_and_does_not_wind_the_kv_estimate_up():
    """CadenceRL holds sessions off the engine on purpose (its pending set): no running-batch bound
    there. In front of a router the KV estimate, not in use under the bound, does not grow."""
    misa, p = running_batch_pool(cadence(), engine_share=0.5)
    misa.observe(p.view)
    assert misa.caps[0] == MAX_CAP_FACTOR * 8          # only the engine-wide ceiling
    misa, p = running_batch_pool(LeastLoadedRouter(), engine_share=0.5, sessions=20)   # over its cap
    for now in range(3):
        p.now = float(now)
        misa.observe(p.view)                           # KV use 0.5%: far under LOW
    assert misa.caps[0] < 20 and misa.scale[0] == pytest.approx(INITIAL_SCALE)


def two_capped(inner):
    """A worker past its cap of 2 beside an empty one with the same cap."""
    misa = MisaT({"rlvr": 1.0})
    busy, idle = loaded(0, 3, cap=1_000_000, seqs=100), worker(1, cap=1_000_000, seqs=100)
    p = pool(Admitted(misa, inner), [busy, idle], fresh=fresh(5))
    misa.observe(p.view)
    misa.caps = {0: 2.0, 1: 2.0}
    return misa, p, busy, idle


def test_in_front_of_a_router_the_caps_are_pooled_so_a_cohort_fills_whichever_workers_can_take_it():
    """A worker past its own cap still takes a new session while the pool holds fewer sessions than
    the caps' sum; no worker does once the pool is full; a worker whose running batch is full never does."""
    misa, p, busy, idle = two_capped(LeastLoadedRouter())
    assert misa.remaining(p.view) == 1 and misa.accepts(p.view, busy) and misa.accepts(p.view, idle)
    idle.sessions = 1
    assert misa.remaining(p.view) == 0 and not misa.accepts(p.view, busy) and not misa.accepts(p.view, idle)
    misa.caps = {0: 2.0, 1: 500.0}
    busy.sessions = int(HIGH * 100 / misa.engine_share)     # its running-batch bound (Little's law)
    assert misa.remaining(p.view) > 0 and misa.accepts(p.view, idle) and not misa.accepts(p.view, busy)


def test_in_front_of_a_policy_that_never_overcommits_kv_each_worker_keeps_its_own_cap():
    """There a cap moves only with its own worker's preemptions and queue: a bound on that worker."""
    misa, p, busy, idle = two_capped(cadence())
    assert misa.remaining(p.view) == 2 and not misa.accepts(p.view, busy) and misa.accepts(p.view, idle)


@pytest.mark.parametrize("inner, room", [(LeastLoadedRouter, 0), (lambda: cadence(), 1)])
def test_a_worker_with_no_cap_yet_counts_as_a_cap_of_one_pooled_or_not(inner, room: int):
    """Before its first look a worker has a cap of 1 in `remaining` as in `accepts`: alone (one
    session) or in the pool's sum (2 + 1 against the busy worker's 3 sessions: none)."""
    misa, p, busy, idle = two_capped(inner())
    del misa.caps[1]
    assert misa.remaining(p.view) == room and misa.accepts(p.view, idle) == (room > 0)


# -- class deficit and its completion-time lead ----------------------------------------------------

def gate_pool(misa, workers, fresh_, inner=None, **state):
    """A pool behind MISA-T; the class quotas hold only in front of a policy that over-commits KV
    (a router, `inner=LeastLoadedRouter()`)."""
    return pool(Admitted(misa, inner or LeastLoaded()), workers, fresh=fresh_, **state)


def admit_n(misa, cls, n, version=0):
    for _ in range(n):
        misa.record(cls, version)


def test_the_class_furthest_behind_its_share_of_the_cohort_is_admitted_next():
    misa = MisaT(MIX)
    admit_n(misa, "agent", 10)
    admit_n(misa, "rlhf", 2)
    admit_n(misa, "agent", 50, version=-1)             # an older cohort: it does not count
    p = gate_pool(misa, [worker(0, cap=1_000_000)], fresh(3, "agent") + fresh(3, "rlhf", start=200))
    misa.observe(p.view)
    assert misa.open_classes(p.view) == {"rlhf"}
    admit_n(misa, "rlhf", 20, version=-1)
    assert misa.open_classes(p.view) == {"rlhf"}       # still behind in the current cohort


def test_a_slow_class_starts_first_in_its_cohort_and_the_lead_fades_as_the_cohort_fills():
    misa = MisaT(MIX)
    warm(misa, "agent", footprint=1000, duration=100)
    warm(misa, "rlhf", footprint=1000, duration=10)
    misa.learner.rate = 2.0                        # sessions complete at 2/s
    counts = {"agent": 100, "rlhf": 59}            # agent already ahead of an even split
    d = misa.deficits(["agent", "rlhf"], horizon=1000, counts=counts)
    # the pool admits 2/s x (100 - 55) s = 90 sessions while an agent session runs past the mean,
    # faded by the cohort's fill (160 of 1000)
    lead = 90 * (1 - 160 / 1000)
    assert d["agent"] == pytest.approx(0.5 * (160 + lead) - 100)
    assert d["rlhf"] == pytest.approx(0.5 * (160 - lead) - 59)
    assert d["agent"] > d["rlhf"]
    full = misa.deficits(["agent", "rlhf"], horizon=160, counts=counts)   # the cohort is full: no lead
    assert full["rlhf"] == pytest.approx(0.5 * 160 - 59)


def test_a_class_too_far_ahead_waits_but_some_class_always_may_go():
    misa = MisaT(MIX)
    admit_n(misa, "agent", 500)
    p = gate_pool(misa, [worker(0, cap=1_000_000)], fresh(3, "agent"), batch=100)
    misa.observe(p.view)
    assert misa.open_classes(p.view) == {"agent"}      # rlhf has nothing waiting: agent goes
    p = gate_pool(misa, [worker(0, cap=1_000_000)], fresh(3, "agent") + fresh(3, "rlhf", start=200), batch=100,
                  inner=LeastLoadedRouter())
    misa.class_caps = {"agent": 1000, "rlhf": 0}
    p.controller.active_by_class["agent"] = 1000       # agent uses its whole quota: nothing to lend
    assert misa.open_classes(p.view) == set()          # rlhf capped, agent far ahead: both wait


def test_a_class_that_used_its_places_in_the_cohort_waits_for_the_capped_class_behind_it():
    """Under eta 1 a full cohort is one consumed batch: a place lent to another class would stay in
    it. The cohort holds what it admitted plus the room the eta budget leaves (here 10 of 2 x 1000)."""
    misa = MisaT(MIX)
    admit_n(misa, "agent", 1000)
    admit_n(misa, "rlhf", 990)
    p = gate_pool(misa, [worker(0, cap=1_000_000)], fresh(20, "agent") + fresh(20, "rlhf", start=300),
                  batch=1000, tags={0: 1990}, total=10_000, inner=LeastLoadedRouter())
    misa.observe(p.view)
    assert p.view.credits.admissible(0, 0) == 10
    assert misa.cohort_places(p.view, ["agent", "rlhf"], 0) == {"agent": 1000, "rlhf": 1000}
    misa.class_caps = {"agent": 10**6, "rlhf": 5}
    p.controller.active_by_class.update({"agent": 10**6, "rlhf": 5})   # rlhf at its cap, nothing to lend
    # agent is within the ahead bound (20) of its share, but its places are used: both wait
    assert misa.open_classes(p.view) == set()
    p.controller.active_by_class["rlhf"] = 4                            # an rlhf session finished
    assert misa.open_classes(p.view) == {"rlhf"}


def test_in_front_of_a_router_new_sessions_join_the_oldest_cohort_with_budget_left_and_only_its_workers_take_them():
    """A router fills an older version's eta budget before its workers move on: the gate balances
    that cohort, not the trainer's, and sends its new sessions only to that version's workers."""
    misa = MisaT(MIX)
    admit_n(misa, "agent", 50, version=0)
    admit_n(misa, "rlhf", 40, version=0)
    old, new = worker(0, cap=1_000_000, version=0), worker(1, cap=1_000_000, version=1)
    p = pool(Admitted(misa, LeastLoadedRouter()), [old, new], fresh=fresh(20, "agent") + fresh(20, "rlhf", start=300),
             trainer_version=1, batch=100, tags={0: 90}, total=10_000)
    misa.observe(p.view)
    assert misa.open_classes(p.view) == {"rlhf"}        # cohort 0: 100 places, agent used its 50
    assert misa.filling(p.view) == 0 and misa.accepts(p.view, old) and not misa.accepts(p.view, new)
    p.controller.credits.record(0, 10)                  # cohort 0's budget is spent
    # asked before open_classes: accepts reads the cohort from the view, not from the last question
    assert misa.filling(p.view) == 1 and misa.accepts(p.view, new) and not misa.accepts(p.view, old)
    assert len(misa.open_classes(p.view)) == 1          # cohort 1, empty: either class may start it


# -- quota lending ---------------------------------------------------------------------------------

def test_a_class_borrows_the_quota_the_others_leave_unused_and_a_class_under_its_own_always_passes():
    misa = MisaT(MIX)
    p = gate_pool(misa, [worker(0, cap=1_000_000)], fresh(3, "agent") + fresh(1, "rlhf", start=300),
                  inner=LeastLoadedRouter())
    misa.observe(p.view)
    misa.class_caps = {"agent": 2, "rlhf": 5}
    admit_n(misa, "rlhf", 10)                          # rlhf ahead: agent is the one behind
    p.controller.active_by_class.update({"agent": 5, "rlhf": 1})
    assert misa.open_classes(p.view) == {"agent"}      # 5 < 2 + (5 - 1) unused by rlhf, lent
    p.controller.active_by_class["agent"] = 6
    misa.cohorts = {}
    assert misa.open_classes(p.view) == {"rlhf"}       # agent past 2 + 4; rlhf under its own quota


def test_in_front_of_a_policy_that_never_overcommits_kv_the_class_quotas_step_aside():
    """They protect each class's KV from the others' over-commit; CadenceRL never over-commits, so
    there a class past its quota still goes when it is the one behind (the cohort places hold the mix)."""
    for inner, opens in ((LeastLoadedRouter(), set()), (cadence(), {"agent"})):
        misa = MisaT(MIX)
        p = gate_pool(misa, [worker(0, cap=1_000_000)], fresh(3, "agent") + fresh(1, "rlhf", start=300), inner=inner)
        misa.observe(p.view)
        misa.class_caps = {"agent": 2, "rlhf": 1}
        admit_n(misa, "rlhf", 10)                      # agent is the one behind
        p.controller.active_by_class.update({"agent": 2, "rlhf": 1})   # both at their quota: nothing lent
        assert misa.open_classes(p.view) == opens, inner.name


# -- continuations ---------------------------------------------------------------------------------

def test_continuations_always_pass_a_closed_gate():
    misa = MisaT({"rlvr": 1.0})
    back = traj(1, 100)
    back.home = 0
    ws = [loaded(0, 4), loaded(1, 4)]
    for w in ws:
        w.num_waiting = 1
    p = pool(Admitted(misa, LeastLoaded()), ws, pending=[back], fresh=fresh(2), admitted=9)
    misa.observe(p.view)
    misa.caps = {0: 4.0, 1: 4.0}                       # every worker at its cap: the gate is closed
    misa._next_adapt = 10.0
    acts = p.decide()
    assert [a for a in acts if isinstance(a, Admit)] == []
    assert Place(1, 0) in acts or Place(1, 1) in acts


@pytest.mark.parametrize("case", ["home", "queues", "hot spot"])
def test_a_routers_continuation_goes_home_unless_home_is_overloaded_or_a_hot_spot(case):
    back = traj(1, 100)
    back.home = 0
    home = loaded(0, 16 if case == "hot spot" else 10, cap=10_000)   # the mean load is 10, or 12
    light, heavy = loaded(1, 5, cap=10_000), loaded(2, 15, cap=10_000)  # the router alone picks `light`
    if case == "queues":
        home.num_waiting = 2
    p = pool(Admitted(MisaT({"rlvr": 1.0}), LeastLoadedRouter()), [home, light, heavy],
             pending=[back], admitted=31)
    acts = p.decide()
    assert acts[0] == (Place(1, 0) if case == "home" else Place(1, 1))


def test_continuations_fill_their_home_only_up_to_the_mean_load_as_they_are_placed():
    """Four continuations of a home under the mean (loads 9, 5, 17): each placed one moves the
    mean up with it, so three go home (a mean read once would stop at two); the fourth would put
    the home over, and the router places it."""
    backs = [traj(i, 100) for i in (1, 2, 3, 4)]
    for b in backs:
        b.home = 0
    home, light, heavy = loaded(0, 9, cap=10_000), loaded(1, 5, cap=10_000), loaded(2, 17, cap=10_000)
    p = pool(Admitted(MisaT({"rlvr": 1.0}), LeastLoadedRouter()), [home, light, heavy],
             pending=backs, admitted=35)
    acts = [a for a in p.decide() if isinstance(a, Place)]
    assert acts[:4] == [Place(1, 0), Place(2, 0), Place(3, 0), Place(4, 1)]


def test_in_front_of_a_policy_that_never_overcommits_full_kv_is_not_pressure():
    """CadenceRL keeps KV full on purpose (it evicts to its pending set): there the caps shrink
    only on preemptions and engine queues, and grow when they bind."""
    misa = MisaT({"rlvr": 1.0})
    warm(misa, "rlvr", footprint=500, duration=10)
    gate = Admitted(misa, cadence())
    assert not misa.kv_is_pressure
    full = loaded(0, 20, cap=10_000)
    full.engine_kv = 9_900
    misa.observe(pool(gate, [full], fresh=fresh(1)).view)   # first cap: 0.5 x 9000 / 500 = 9 < 20 sessions
    p = pool(gate, [full], fresh=fresh(1))
    p.now = 1.0
    misa.observe(p.view)
    assert misa.scale[0] == pytest.approx(INITIAL_SCALE / DECREASE)   # 99% KV, its cap in use: it grew
    full.preemptions += 1
    full.sessions = 5                                  # most finished: the cap (11) is above them
    p.now = 2.0
    before = misa.scale[0]
    misa.observe(p.view)
    assert misa.scale[0] == pytest.approx(before * DECREASE)
