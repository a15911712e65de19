"""The baseline policies' decisions on hand-built pools: each policy's stated rule, one at a time
(CadenceRL's are in test_cadence_unit.py, the routers' in test_routers_unit.py)."""

from __future__ import annotations

from cadencerl.core.actions import Admit, Advance, Evict, Interrupt, Place
from cadencerl.core.view import strands_work
from cadencerl.policies.areal import AReaL
from cadencerl.policies.dora import Dora
from cadencerl.policies.laminar import Laminar
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.policies.sync import Synchronous
from tests.pools import pool, traj, worker


def fresh(n, start=100, ctx=10):
    return [traj(i, ctx) for i in range(start, start + n)]


def admits(actions):
    return [a.worker for a in actions if isinstance(a, Admit)]


# -- the shared rule: who may advance ------------------------------------------------------------

def test_an_empty_worker_may_advance_unless_it_is_the_last_home_of_off_worker_work():
    lone, other = worker(0), worker(1, version=1)
    p = pool(LeastLoaded(), [lone, other], pending=[traj(1, 100)], trainer_version=1, admitted=200)
    assert not p.view.may_advance(lone)                     # its version's pending work needs it
    assert strands_work(lone, p.controller.workers, p.controller.pending, p.controller.tool_waiting)
    q = pool(LeastLoaded(), [worker(0), worker(1)], pending=[traj(1, 100)], trainer_version=1, admitted=200)
    assert q.view.may_advance(q.controller.workers[0])      # a sibling of its version stays behind
    r = pool(LeastLoaded(), [worker(0), worker(1, version=1)], tool_waiting={0: 1}, trainer_version=1)
    assert not r.view.may_advance(r.controller.workers[0])  # a trajectory on a tool call needs it too


def test_advance_idle_moves_only_empty_workers_whose_version_has_no_budget():
    # version 0's budget is spent (200 outstanding, eta 1, batch 100); version 1 has room
    busy = worker(1, residents=[traj(1, 100)])
    acts = pool(LeastLoaded(), [worker(0), busy], trainer_version=1, admitted=200).decide()
    assert acts == [Advance(0, 1)]
    # with budget left under version 0 the empty worker stays to take it
    acts = pool(LeastLoaded(), [worker(0), worker(1, residents=[traj(1, 100)])], trainer_version=1,
                admitted=50, fresh=fresh(1)).decide()
    assert not any(isinstance(a, Advance) for a in acts)


# -- least-loaded ---------------------------------------------------------------------------------

def test_least_loaded_admits_to_the_worker_with_fewest_residents_lowest_id_first():
    ws = [worker(0, residents=[traj(1, 10), traj(2, 10)]), worker(1), worker(2, residents=[traj(3, 10)])]
    acts = pool(LeastLoaded(), ws, fresh=fresh(3)).decide()
    assert admits(acts) == [1, 1, 2]
    # the floor's twin (benchmarks/least_loaded_floor.py --floor-twin): the same rule, ties to the highest id
    ws = [worker(0, residents=[traj(1, 10), traj(2, 10)]), worker(1), worker(2, residents=[traj(3, 10)])]
    assert admits(pool(LeastLoaded(ties_to_last=True), ws, fresh=fresh(3)).decide()) == [1, 2, 1]


# -- sync and one-off -----------------------------------------------------------------------------

def test_the_barrier_holds_while_a_batch_is_still_in_flight():
    # one-off: batch 0 consumed, batch 1 (tag 1) admitted and 3 of its 4 still running
    acts = pool(Synchronous(overlap=True), [worker(0, version=1), worker(1, version=1)], fresh=fresh(4), batch=4,
                total=12, trainer_version=1, consumed=4, tags={1: 4}, done=5).decide()
    assert acts == []
    # the same once batch 1 has completed and is training: batch 2 rolls out
    acts = pool(Synchronous(overlap=True), [worker(0, version=1), worker(1, version=1)], fresh=fresh(4), batch=4,
                total=12, trainer_version=1, trainer_busy=True, consumed=8, tags={}, done=8).decide()
    assert admits(acts) == [0, 1, 0, 1]


def _after_batch_0(policy, trainer_version, busy):
    """Batch 0 (4 trajectories) done and consumed; the policy's decision on batch 1."""
    return pool(policy, [worker(0), worker(1)], fresh=fresh(6), batch=4, total=12, tags={}, consumed=4, done=4,
                trainer_version=trainer_version, trainer_busy=busy).decide()


def test_sync_rolls_out_the_next_batch_only_with_the_newest_weights():
    assert _after_batch_0(Synchronous(overlap=False), 0, True) == []   # batch 0 still training
    acts = _after_batch_0(Synchronous(overlap=False), 1, False)
    assert acts[:2] == [Advance(0, 1), Advance(1, 1)]                 # all take version 1 at the barrier
    assert admits(acts) == [0, 1, 0, 1]                               # then one batch, least-loaded


def test_one_off_rolls_out_the_next_batch_while_the_last_one_trains():
    acts = _after_batch_0(Synchronous(overlap=True), 0, True)
    assert admits(acts) == [0, 1, 0, 1]                               # batch 1 under version 0: staleness 1
    assert not any(isinstance(a, Advance) for a in acts)


# -- AReaL ----------------------------------------------------------------------------------------

def test_areal_interrupts_every_worker_behind_the_trainer_and_resumes_in_place():
    running = traj(1, 500)
    p = pool(AReaL(), [worker(0, residents=[running]), worker(1, version=1)], trainer_version=1, admitted=200)
    acts = p.decide()
    assert acts == [Interrupt(0, 1)]
    assert running.worker == 0 and running.versions == [0, 1]


def test_areal_dispatches_new_rollouts_round_robin_whatever_the_load():
    ws = [worker(0), worker(1, residents=[traj(i, 10) for i in range(1, 9)]), worker(2)]
    acts = pool(AReaL(), ws, fresh=fresh(4)).decide()
    assert admits(acts) == [0, 1, 2, 0]


def test_areal_sends_a_resumed_request_back_to_its_server():
    back = traj(1, 500)
    back.kv_home = 2
    acts = pool(AReaL(), [worker(0), worker(1), worker(2)], pending=[back], admitted=1).decide()
    assert acts == [Place(1, 2)]


# -- Laminar --------------------------------------------------------------------------------------

def test_laminar_repacks_an_underused_worker_of_a_finished_version_and_advances_it():
    # 8 slots: a worker with one resident is under 25% utilised; version 0's budget is spent
    src = worker(0, seqs=8, residents=[traj(1, 500)])
    dst = worker(1, seqs=8, residents=[traj(2, 500), traj(3, 500), traj(4, 500)])
    acts = pool(Laminar(), [src, dst, worker(2, version=1)], trainer_version=1, admitted=200).decide()
    assert acts[:3] == [Evict(1), Place(1, 1), Advance(0, 1)]


def test_laminar_keeps_a_target_margin_when_repacking():
    # the fuller worker would be left with under 10% of its KV free: no move
    src = worker(0, seqs=8, residents=[traj(1, 500)])
    dst = worker(1, seqs=8, residents=[traj(2, 4000), traj(3, 4000), traj(4, 600)])
    acts = pool(Laminar(), [src, dst, worker(2, version=1)], trainer_version=1, admitted=200).decide()
    assert not any(isinstance(a, Evict) for a in acts)


def test_laminar_places_continuations_on_the_fullest_worker_with_room():
    ws = [worker(0), worker(1, residents=[traj(2, 100), traj(3, 100)]), worker(2, residents=[traj(4, 100)])]
    acts = pool(Laminar(), ws, pending=[traj(1, 200)], admitted=4).decide()
    assert acts[0] == Place(1, 1)


# -- DORA* ----------------------------------------------------------------------------------------

def test_dora_repartitions_at_a_weight_sync_and_hands_over_the_least_loaded_worker():
    # version 0 has 3 unfinished trajectories against 50 fresh under version 1: it keeps one worker
    keep = worker(0, residents=[traj(1, 500), traj(2, 500)])
    give = worker(1, residents=[traj(3, 500)])
    # batch 0 consumed, 97 of version 0's second hundred done: its budget is spent, version 1's open
    acts = pool(Dora(), [keep, give, worker(2), worker(3)], fresh=fresh(50), trainer_version=1, consumed=100,
                tags={0: 100}, done=197, total=1000).decide()
    moved = [a for a in acts if not isinstance(a, Admit)]
    assert moved == [Advance(2, 1), Advance(3, 1), Evict(3), Place(3, 0), Advance(1, 1)]
