"""The controller refuses every invalid action, one test per kind of ActionError it raises.

Each refusal is checked with the state that makes it invalid next to the nearest valid state, so a
check that was dropped or loosened fails here.
"""

from __future__ import annotations

import dataclasses

import pytest

from cadencerl.core.actions import ActionError, Admit, Advance, Batch, Evict, Interrupt, Place, UpdateInPlace
from cadencerl.core.policy import Policy
from cadencerl.core.trajectory import State
from tests.pools import pool, traj, worker


class Passive(Policy):
    """A policy that proposes nothing: these tests hand the controller actions themselves."""

    name = "passive"

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
@pytest.mark.parametrize("move", [Interrupt, UpdateInPlace])
def test_moving_residents_to_a_version_outside_the_published_ones_is_refused(move, target):
    t = traj(1, 100)
    ctl = controller([worker(0, residents=[t])], trainer_version=1)
    with pytest.raises(ActionError, match=f"from version 0 to {target}"):
        ctl.apply(move(0, target), 0.0)
    assert ctl.workers[0].version == 0 and t.versions == [0]
    ctl.apply(move(0, 1), 0.0)
    assert t.state is State.RESIDENT and t.versions == [0, 1] and t.worker == 0


def test_a_refused_action_leaves_the_state_untouched():
    full = worker(0, cap=1000, residents=[traj(1, 900)])
    fresh = traj(2, 200)
    ctl = controller([full], fresh=[fresh])
    with pytest.raises(ActionError):
        ctl.apply(Admit(0, 2), 0.0)
    assert fresh.state is State.FRESH and len(ctl.fresh) == 1 and ctl.credits.admitted == 0
    assert full.kv_used == 900 and list(full.residents) == [1]


# -- a batch: checked as the same actions one by one would be, before any of it happens ------------

def _batch(*steps) -> Batch:
    """Batch from ("admit" | "place", trajectory, worker) steps."""
    return Batch(tuple(t for _, t, _ in steps), tuple(w for _, _, w in steps), tuple(k == "admit" for k, _, _ in steps))


def _books(ctl):
    return ([(w.kv_used, sorted(w.residents), w.sessions) for w in ctl.workers], len(ctl.fresh), ctl.credits.admitted,
            dataclasses.asdict(ctl.counters),
            dict(ctl.credits.outstanding_by_tag), len(ctl.pending), dict(ctl.active_by_class),
            sorted((t.id, t.state.value, t.worker, t.versions[-1] if t.versions else None)
                   for t in ctl.trajectories.values()))


def _two_pools():
    def make():
        moved = traj(5, 300)
        moved.kv_home = 1      # its KV sits on worker 1: a move to worker 0 migrates it
        return controller([worker(0, cap=1000, residents=[traj(1, 400)]), worker(1, cap=1000)],
                          fresh=[traj(2, 100), traj(3, 200), traj(4, 301)], pending=[moved])
    return make(), make()


def test_a_batch_leaves_the_books_as_its_actions_one_by_one_do():
    one_by_one, batched = _two_pools()
    steps = [("admit", 2, 0), ("place", 5, 0), ("admit", 3, 1), ("admit", 4, 1)]
    for kind, t, w in steps:
        one_by_one.apply(Admit(w, t) if kind == "admit" else Place(t, w), 0.0)
    batched.apply(_batch(*steps), 0.0)
    assert _books(batched) == _books(one_by_one)
    assert batched.backend.calls == one_by_one.backend.calls   # the engines see the same placements, in order
    assert _batch(*steps).actions == (Admit(0, 2), Place(5, 0), Admit(1, 3), Admit(1, 4))


@pytest.mark.parametrize("steps, error", [
    ([("admit", 2, 0), ("admit", 3, 0), ("admit", 4, 0)], "exceeds its KV capacity"),   # 400+100+200+301 > 1000
    ([("admit", 2, 0), ("admit", 2, 1)], "names a trajectory twice"),
    ([("admit", 2, 0), ("admit", 9, 1)], "unknown trajectory 9"),
    ([("admit", 2, 0), ("place", 3, 1)], "trajectory 3 is not pending"),
    ([("admit", 2, 0), ("admit", 5, 1)], "trajectory 5 is not fresh"),
    ([("admit", 2, 0), ("admit", 3, 7)], "worker 7 does not exist"),
    ([("place", 5, 0), ("admit", 3, 0), ("admit", 4, 0)], "exceeds its KV capacity"),   # a move counts too
])
def test_a_batch_with_one_bad_step_is_refused_whole(steps, error):
    ctl, untouched = _two_pools()
    with pytest.raises(ActionError, match=error):
        ctl.apply(_batch(*steps), 0.0)
    assert _books(ctl) == _books(untouched) and ctl.backend.calls == []
    ctl.apply(_batch(*steps[:1]), 0.0)   # its first step alone is fine


@pytest.mark.parametrize("onto, error", [("newer", "cannot run on worker 1 at"), ("lost", "worker 1 does not exist or is lost")])
def test_a_batch_moves_work_only_onto_a_live_worker_of_its_version(onto, error):
    moved = traj(5, 300)
    other = worker(1, version=1 if onto == "newer" else 0)
    other.alive = onto != "lost"
    ctl = controller([worker(0), other], fresh=[traj(2, 100)], pending=[moved], trainer_version=1)
    untouched = _books(ctl)
    with pytest.raises(ActionError, match=error):
        ctl.apply(_batch(("admit", 2, 0), ("place", 5, 1)), 0.0)
    assert _books(ctl) == untouched and ctl.backend.calls == []


def test_a_batch_within_the_kv_is_accepted_up_to_exactly_full():
    ctl, _ = _two_pools()
    ctl.apply(_batch(("admit", 2, 0), ("admit", 3, 0), ("place", 5, 0)), 0.0)   # 400+100+200+300 = 1000
    assert ctl.workers[0].kv_used == 1000


def test_a_batch_past_the_eta_budget_is_refused_whole():
    # eta 1, batch 100: 200 may be outstanding; 198 are, so two more may start and not three
    ctl = controller([worker(0), worker(1)], fresh=[traj(1, 10), traj(2, 10), traj(3, 10)], admitted=198, batch=100)
    with pytest.raises(ActionError, match="eta budget is spent"):
        ctl.apply(_batch(("admit", 1, 0), ("admit", 2, 1), ("admit", 3, 0)), 0.0)
    assert ctl.credits.admitted == 198 and len(ctl.fresh) == 3
    ctl.apply(_batch(("admit", 1, 0), ("admit", 2, 1)), 0.0)
    assert ctl.credits.admitted == 200


def test_a_batch_admits_under_one_version():
    ctl = controller([worker(0), worker(1, version=1)], fresh=[traj(1, 10), traj(2, 10)], trainer_version=1)
    with pytest.raises(ActionError, match="admits under one version"):
        ctl.apply(_batch(("admit", 1, 0), ("admit", 2, 1)), 0.0)


def test_a_batch_of_a_router_that_queues_at_the_engine_is_held_to_the_whole_kv_only():
    busy = worker(0, cap=1000, residents=[traj(1, 900)])
    ctl = controller([busy], fresh=[traj(2, 500), traj(3, 1000)], queues_at_engine=True)
    with pytest.raises(ActionError, match="exceeds worker 0's KV"):
        ctl.apply(_batch(("admit", 2, 0), ("admit", 3, 0)), 0.0)
    ctl.apply(_batch(("admit", 2, 0)), 0.0)
