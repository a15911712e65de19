"""The controller refuses every invalid action, one test per kind of ActionError it raises.

Each refusal is checked with the state that makes it invalid next to the nearest valid state, so a
check that was dropped or loosened fails here.
"""

from __future__ import annotations

import pytest

from cadencerl.core.actions import ActionError, Admit, Advance, Evict, Interrupt, Place
from cadencerl.core.trajectory import State
from tests.pools import pool, traj, worker


class Passive:
    """A policy that proposes nothing: these tests hand the controller actions themselves."""

    name = "passive"
    kv_transfer = False

    def __init__(self, queues_at_engine: bool = False) -> None:
        self.queues_at_engine = queues_at_engine

    def decide(self, view):
        return iter(())


def controller(workers, **state):
    return pool(Passive(state.pop("queues_at_engine", False)), workers, **state).controller


def test_an_unknown_action_is_refused():
    ctl = controller([worker(0)])
    with pytest.raises(ActionError, match="unknown action"):
        ctl.apply(("admit", 0, 1), 0.0)


def test_an_unknown_trajectory_is_refused():
    ctl = controller([worker(0)], fresh=[traj(1, 10)])
    with pytest.raises(ActionError, match="unknown trajectory 7"):
        ctl.apply(Admit(0, 7), 0.0)


@pytest.mark.parametrize("wid", [2, -1])
def test_a_worker_that_does_not_exist_is_refused(wid):
    ctl = controller([worker(0), worker(1)], fresh=[traj(1, 10)])
    with pytest.raises(ActionError, match=f"worker {wid} does not exist"):
        ctl.apply(Admit(wid, 1), 0.0)


def test_a_lost_worker_is_refused():
    lost = worker(1)
    lost.alive = False
    ctl = controller([worker(0), lost], fresh=[traj(1, 10)])
    with pytest.raises(ActionError, match="worker 1 does not exist or is lost"):
        ctl.apply(Admit(1, 1), 0.0)
    ctl.apply(Admit(0, 1), 0.0)   # the live one takes it


def test_placing_over_kv_capacity_is_refused():
    full = worker(0, cap=1000, residents=[traj(1, 900)])
    ctl = controller([full], fresh=[traj(2, 101), traj(3, 100)])
    with pytest.raises(ActionError, match="exceeds its KV capacity"):
        ctl.apply(Admit(0, 2), 0.0)
    ctl.apply(Admit(0, 3), 0.0)   # exactly full is allowed
    assert full.kv_used == 1000


def test_a_router_may_queue_past_headroom_but_never_past_the_whole_kv():
    busy = worker(0, cap=1000, residents=[traj(1, 900)])
    ctl = controller([busy], fresh=[traj(2, 500), traj(3, 1000)], queues_at_engine=True)
    ctl.apply(Admit(0, 2), 0.0)   # queued at the engine: its waiting queue holds no KV
    with pytest.raises(ActionError, match="exceeds worker 0's KV"):
        ctl.apply(Admit(0, 3), 0.0)   # 1000 tokens + the next one can never run on 1000 tokens of KV


def test_admitting_a_trajectory_that_is_not_fresh_is_refused():
    ctl = controller([worker(0), worker(1)], fresh=[traj(1, 10)])
    ctl.apply(Admit(0, 1), 0.0)
    with pytest.raises(ActionError, match="trajectory 1 is not fresh"):
        ctl.apply(Admit(1, 1), 0.0)


def test_admitting_past_the_eta_budget_is_refused():
    # eta 1, batch 100, nothing consumed yet: versions 0 may have 200 trajectories outstanding
    ctl = controller([worker(0)], fresh=[traj(1, 10), traj(2, 10)], admitted=199, batch=100)
    ctl.apply(Admit(0, 1), 0.0)
    with pytest.raises(ActionError, match="eta budget is spent"):
        ctl.apply(Admit(0, 2), 0.0)


def test_placing_a_trajectory_that_is_not_pending_is_refused():
    resident = traj(1, 100)
    ctl = controller([worker(0, residents=[resident]), worker(1)])
    with pytest.raises(ActionError, match="trajectory 1 is not pending"):
        ctl.apply(Place(1, 1), 0.0)
    ctl.apply(Evict(1), 0.0)
    ctl.apply(Place(1, 1), 0.0)   # once departed it may go anywhere of its version
    assert resident.worker == 1


def test_placing_on_a_worker_of_another_version_is_refused():
    ctl = controller([worker(0, version=1), worker(1, version=0)], pending=[traj(1, 100, version=0)],
                     trainer_version=1)
    with pytest.raises(ActionError, match="of version 0 cannot run on worker 0 at version 1"):
        ctl.apply(Place(1, 0), 0.0)
    ctl.apply(Place(1, 1), 0.0)


def test_evicting_a_trajectory_that_is_not_resident_is_refused():
    ctl = controller([worker(0)], pending=[traj(1, 100)])
    with pytest.raises(ActionError, match="trajectory 1 is not resident"):
        ctl.apply(Evict(1), 0.0)


def test_advancing_a_busy_worker_is_refused():
    busy = worker(0, residents=[traj(1, 100)])
    ctl = controller([busy, worker(1)], trainer_version=1)
    with pytest.raises(ActionError, match="cannot advance with 1 residents"):
        ctl.apply(Advance(0, 1), 0.0)
    ctl.apply(Advance(1, 1), 0.0)


@pytest.mark.parametrize("target", [0, 2])
def test_advancing_outside_the_published_versions_is_refused(target):
    """A worker moves forward only, and never past the trainer's latest version."""
    ctl = controller([worker(0, version=0), worker(1)], trainer_version=1)
    with pytest.raises(ActionError, match=f"from version 0 to {target}"):
        ctl.apply(Advance(0, target), 0.0)


@pytest.mark.parametrize("where", ["pending", "tool"])
def test_advancing_the_last_worker_of_a_version_with_work_left_is_refused(where):
    waiting = traj(1, 100)
    state = {"pending": [waiting]} if where == "pending" else {"tool_waiting": {0: 1}}
    ctl = controller([worker(0), worker(1, version=1)], trainer_version=1, **state)
    with pytest.raises(ActionError, match="last worker of version 0"):
        ctl.apply(Advance(0, 1), 0.0)


def test_advancing_is_allowed_while_another_worker_keeps_the_version():
    ctl = controller([worker(0), worker(1)], pending=[traj(1, 100)], trainer_version=1)
    ctl.apply(Advance(0, 1), 0.0)
    assert ctl.workers[0].version == 1
    with pytest.raises(ActionError, match="last worker of version 0"):
        ctl.apply(Advance(1, 1), 0.0)


@pytest.mark.parametrize("target", [0, 2])
def test_interrupting_to_a_version_outside_the_published_ones_is_refused(target):
    t = traj(1, 100)
    ctl = controller([worker(0, residents=[t])], trainer_version=1)
    with pytest.raises(ActionError, match=f"from version 0 to {target}"):
        ctl.apply(Interrupt(0, target), 0.0)
    ctl.apply(Interrupt(0, 1), 0.0)
    assert t.state is State.RESIDENT and t.versions == [0, 1]


def test_a_refused_action_leaves_the_state_untouched():
    full = worker(0, cap=1000, residents=[traj(1, 900)])
    fresh = traj(2, 200)
    ctl = controller([full], fresh=[fresh])
    with pytest.raises(ActionError):
        ctl.apply(Admit(0, 2), 0.0)
    assert fresh.state is State.FRESH and len(ctl.fresh) == 1 and ctl.credits.admitted == 0
    assert full.kv_used == 900 and list(full.residents) == [1]
