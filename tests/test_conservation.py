"""The end-of-run conservation check catches what it is there to catch: every "conserves" test
relies on it, so each of its findings is shown to fire on a run whose books were broken by hand."""

from __future__ import annotations

import pytest

from cadencerl.core.diagnostics import conservation_problems
from cadencerl.core.trajectory import State
from cadencerl.core.environment import Environment
from tests.conftest import sim, small


@pytest.fixture
def finished():
    """The controller and backend of a small run that passed the check."""
    kept: dict = {}
    sim(small(trajectories=48, batch=16), "cadence", keep=kept)
    ctl, backend = kept["controller"], kept["backend"]
    assert ctl.check_conservation() == []
    return ctl, backend


def _problems(ctl) -> str:
    return "; ".join(ctl.check_conservation())


def test_a_trajectory_left_unfinished_is_found(finished):
    ctl, _ = finished
    next(iter(ctl.trajectories.values())).state = State.PENDING
    assert "not every trajectory completed" in _problems(ctl)


def test_one_completed_before_its_admission_is_found(finished):
    ctl, _ = finished
    t = next(iter(ctl.trajectories.values()))
    t.completed_at = t.admitted_at - 1.0
    assert f"trajectory {t.id} completed before it was admitted" in _problems(ctl)


def test_a_batch_the_trainer_did_not_consume_is_found(finished):
    ctl, _ = finished
    ctl.trainer.consumed -= 1
    assert f"trainer consumed {len(ctl.trajectories) - 1} of {len(ctl.trajectories)}" in _problems(ctl)


def test_a_completion_counted_twice_by_the_engine_is_found(finished):
    ctl, backend = finished
    tid = next(iter(backend.env.completions))
    backend.env.completions[tid] = 2
    assert "completed more than once" in _problems(ctl)


def test_kv_held_over_a_worker_capacity_is_found(finished):
    ctl, backend = finished
    engine = backend.engines[0]
    engine.peak_kv = engine.capacity + 1
    assert f"worker {engine.id} held" in _problems(ctl)


def test_a_reply_of_the_wrong_length_is_found(finished):
    ctl, backend = finished
    backend.env.problems.append("trajectory 3 generated 10 tokens, sealed 12")
    assert "trajectory 3 generated 10 tokens" in _problems(ctl)


def test_work_left_pending_is_found():
    assert conservation_problems([], [], pending=2, consumed=0) == ["pending set not empty at the end: 2"]


def test_a_run_whose_books_do_not_balance_fails_loudly(monkeypatch):
    # The environment's books, which the backend's verify reports (the backend may be compiled: not patchable)
    monkeypatch.setattr(Environment, "verify", lambda self: ["worker 0 still holds requests at the end"])
    with pytest.raises(AssertionError, match="conservation check failed: worker 0 still holds"):
        sim(small(trajectories=48, batch=16), "cadence")


def test_a_trajectory_finished_twice_fails_at_once(finished):
    ctl, _ = finished
    t = next(iter(ctl.trajectories.values()))
    with pytest.raises(AssertionError, match=f"trajectory {t.id} finished twice"):
        ctl._finish(t, ctl.now)
