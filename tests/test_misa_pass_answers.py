"""MISA-T's answers kept within a decision pass are never stale, and its lone-class shortcuts give
the general rule's answers: the same decisions, asked for less."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from cadencerl.admission.misa import MisaT
from cadencerl.admission.misa_learn import ClassStats
from cadencerl.core.mix import _target_counts, target_counts
from tests.conftest import ran_in_plain_python, sim
from tests.pools import cadence, pool, worker
from tests.test_misa_routers import mixed
from tests.test_router_replay import _specs, record, replay_live


def checked_keeping(monkeypatch) -> dict[str, int]:
    """Every question a pass answers from what it kept is answered afresh too, and must agree."""
    keep = MisaT._keep
    counts = {"kept": 0, "asked": 0}

    def checking(self, key, compute, view, *args):
        counts["asked"] += 1
        if self._kept is not None and key in self._kept:
            counts["kept"] += 1
        answer = keep(self, key, compute, view, *args)
        assert answer == compute(view, *args), f"{key}: kept {answer!r}, asked afresh {compute(view, *args)!r}"
        return answer

    monkeypatch.setattr(MisaT, "_keep", checking)
    return counts


def test_kept_answers_equal_fresh_ones_in_whole_runs_and_a_live_sequence(monkeypatch, request) -> None:
    if ran_in_plain_python(request):        # it patches MisaT's method
        return
    counts = checked_keeping(monkeypatch)
    for policy in ("misa+cache-aware", "misa+cadence"):
        assert sim(mixed(), policy)["trajectories_completed"] == 600
    specs = _specs(40, random.Random(1))
    replay_live("misa+cache-aware", specs, record("misa+cache-aware", specs, steps=60, seed=7))
    assert counts["kept"] > 1000 and 3 * counts["kept"] > counts["asked"]   # a third and more answered from the keep


def test_outside_a_pass_nothing_is_kept() -> None:
    misa = MisaT({"a": 1.0})
    view = pool(cadence(), [worker(0)]).controller.view(0.0)
    calls = []
    assert misa._keep("k", lambda view: calls.append(view) or len(calls), view) == 1
    assert misa._keep("k", lambda view: calls.append(view) or len(calls), view) == 2
    misa.begin_pass()
    assert [misa._keep("k", lambda view: calls.append(view) or len(calls), view) for _ in range(2)] == [3, 3]
    misa.applied()
    assert misa._keep("k", lambda view: calls.append(view) or len(calls), view) == 4
    misa.end_pass()
    assert misa._kept is None


@given(st.floats(min_value=1e-6, max_value=1e6), st.integers(min_value=0, max_value=10**6))
def test_one_class_with_a_share_takes_every_place(share: float, n: int) -> None:
    assert target_counts({"c": share}, n) == dict(_target_counts((("c", share),), n)) == {"c": n}


@given(st.integers(min_value=0, max_value=10**6), st.floats(min_value=0.01, max_value=1e5),
       st.floats(min_value=0.0, max_value=1e3), st.floats(min_value=0.0, max_value=1e4))
def test_a_class_alone_is_one_session_behind(admitted: int, duration: float, rate: float, horizon: float) -> None:
    """What `open_classes` uses without asking `deficits` when one class has places left."""
    misa = MisaT({"a": 0.3, "b": 0.7})
    misa.learner.stats["a"] = ClassStats(footprint=100.0, duration=duration, completed=10**6)
    misa.learner.rate = rate
    assert misa.deficits(["a"], horizon, {"a": admitted, "b": 7}) == {"a": 1.0}
