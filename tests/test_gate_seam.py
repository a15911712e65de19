"""The seam between an admission layer and the placement policy behind it: the layer's caps hold
within one decision, it balances the cohort a session really joins, a full layer holds work back
without spending a version's budget, and the wrapped policy keeps every mechanism of its own."""

from __future__ import annotations

from collections import Counter

import pytest

from cadencerl.admission.misa import Admitted, MisaT
from cadencerl.config import builtin_scenario
from cadencerl.core.actions import ActionError, Admit, Advance, Place
from cadencerl.core.policy import PLACEMENT_TRAITS
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.policies.routers import LeastLoadedRouter
from cadencerl.runs.registry import make_policy
from tests.pools import cadence, pool, traj, worker


def fresh(n, start=100, classes=("rlvr",)):
    return [traj(i, 10, cls=classes[i % len(classes)]) for i in range(start, start + n)]


def pinned(misa: MisaT, view, caps: dict[int, float]) -> None:
    """Learn once from `view`, then hold `caps` through the decisions that follow."""
    misa.observe(view)
    misa._next_adapt = 1e9
    misa.caps = caps


def test_behind_cadence_a_worker_at_its_cap_takes_no_more_sessions_in_the_same_decision():
    misa = MisaT({"rlvr": 1.0})
    tight = worker(0, residents=[traj(i, 10) for i in range(1000, 1002)])   # 2 sessions, cap 3
    roomy = worker(1)
    p = pool(Admitted(misa, cadence(spread={"when_underloaded": False})),
             [tight, roomy], fresh=fresh(40))
    pinned(misa, p.view, {0: 3.0, 1: 50.0})
    admits = Counter(a.worker for a in p.decide() if isinstance(a, Admit))
    assert admits == {0: 1, 1: 39}     # the tight fit would put all 40 on worker 0
    assert tight.sessions == 3


def test_behind_cadence_a_session_moving_its_home_onto_a_worker_can_fill_its_cap():
    """A resumed session placed away from its home moves it: the worker it lands on counts one
    more session, which may reach its cap before the fresh work of the same decision."""
    misa = MisaT({"rlvr": 1.0})
    tight = worker(0, residents=[traj(i, 10) for i in range(1000, 1002)])   # 2 sessions, cap 3
    roomy = worker(1)
    back = traj(1, 5)                     # shorter than the fresh work: placed first, on the tight fit
    back.home, roomy.sessions = 1, 1
    p = pool(Admitted(misa, cadence(spread={"when_underloaded": False})),
             [tight, roomy], pending=[back], fresh=fresh(10))
    pinned(misa, p.view, {0: 3.0, 1: 50.0})
    acts = p.decide()
    assert acts[0] == Place(1, 0) and tight.sessions == 3
    assert Counter(a.worker for a in acts if isinstance(a, Admit)) == {1: 10}


def test_the_controller_refuses_an_admission_the_layer_holds():
    misa = MisaT({"rlvr": 1.0})
    full = worker(0, residents=[traj(i, 10) for i in range(1000, 1003)])
    p = pool(Admitted(misa, LeastLoaded()), [full], fresh=fresh(1))
    pinned(misa, p.view, {0: 3.0})
    with pytest.raises(ActionError, match="admission layer"):
        p.controller.apply(Admit(0, 100), 0.0)


@pytest.mark.parametrize("inner", [LeastLoaded, cadence])
def test_the_layer_balances_the_cohort_a_session_joins_not_the_trainers(inner):
    """Workers still on version 0 with budget left, the trainer at 1: the sessions join cohort 0,
    so that is the one to hold at the target mix (balancing cohort 1, which never moves, admitted
    one class only)."""
    misa = MisaT({"agent": 0.5, "rlhf": 0.5})
    workers = [worker(0, cap=1_000_000, seqs=1000), worker(1, cap=1_000_000, seqs=1000)]
    p = pool(Admitted(misa, inner()), workers, fresh=fresh(40, classes=("agent", "rlhf")),
             trainer_version=1, tags={0: 80})
    pinned(misa, p.view, {0: 1000.0, 1: 1000.0})
    admitted = [a.traj for a in p.decide() if isinstance(a, Admit)]
    assert len(admitted) == 20
    assert Counter(p.controller.trajectories[t].workload_class for t in admitted) == {"agent": 10, "rlhf": 10}


def test_a_full_layer_does_not_move_an_idle_worker_off_a_version_with_budget_left():
    """The router's `when-idle` rule moves a worker once its version's eta budget is spent; a
    layer at its cap holds that budget back for later, it does not spend it."""
    misa = MisaT({"rlvr": 1.0})
    busy = worker(0, residents=[traj(i, 10) for i in range(1000, 1008)])
    idle = worker(1)
    newer = worker(2, version=1, residents=[traj(2000, 10, version=1)])
    p = pool(Admitted(misa, LeastLoadedRouter()), [busy, idle, newer], fresh=fresh(10),
             trainer_version=1, tags={0: 80, 1: 1})
    pinned(misa, p.view, {0: 4.0, 1: 4.0, 2: 1.0})     # pooled: 9 places, all 9 held
    view = p.view
    assert view.budget(0) > 0 and view.admissible(0) == 0
    assert not [a for a in p.decide() if isinstance(a, Advance)]
    misa.caps = {0: 4.0, 1: 4.0, 2: 1.0}
    p.controller.credits.record(0, view.credits.admissible(0, view.next_batch))   # spent: now it moves
    assert Advance(1, 1) in p.decide()


@pytest.mark.parametrize("inner", ["cadence", "laminar", "one-off", "least-loaded", "cache-aware"])
@pytest.mark.parametrize("admission", ["misa", "cap64"])
def test_a_wrapped_policy_keeps_every_trait_the_backend_reads(inner, admission):
    scenario = builtin_scenario("mixed-16a8h")
    alone, wrapped = make_policy(inner, scenario), make_policy(f"{admission}+{inner}", scenario)
    for trait in PLACEMENT_TRAITS:
        assert getattr(wrapped, trait) == getattr(alone, trait), trait
