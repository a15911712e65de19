"""The fresh queue against a plain list: taking from anywhere keeps arrival order, counts and peeks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadencerl.core.fresh import FreshQueue
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import Trajectory

pytestmark = pytest.mark.timeout(60)
KEY = object()
CLASSES = ("rlvr", "rlhf", "agentic")


def traj(i: int, cls: str) -> Trajectory:
    return Trajectory(TrajectorySpec(i, i, 10, HiddenLength(5, KEY), workload_class=cls))


def check_same(q: FreshQueue, model: list[Trajectory], pushed: list[Trajectory]) -> None:
    """`q` holds `model`, in order; classes are listed in the order they first arrived (`pushed`)."""
    assert len(q) == len(model) and bool(q) == bool(model)
    waiting = {t.workload_class for t in model}
    assert q.classes() == [c for c in dict.fromkeys(t.workload_class for t in pushed) if c in waiting]
    for cls in CLASSES:
        assert q.count(cls) == sum(t.workload_class == cls for t in model)
        assert q.peek({cls}) is next((t for t in model if t.workload_class == cls), None)
    assert q.peek() is (model[0] if model else None)
    assert q.peek({"rlhf", "agentic"}) is next((t for t in model if t.workload_class != "rlvr"), None)


@settings(max_examples=150, deadline=None)
@given(classes=st.lists(st.sampled_from(CLASSES), min_size=0, max_size=40),
       ops=st.lists(st.tuples(st.sampled_from(["take", "push"]), st.integers(0, 1000), st.sampled_from(CLASSES)),
                    max_size=60))
def test_matches_a_list_under_takes_from_anywhere_and_pushes(classes, ops):
    trajs = [traj(i, c) for i, c in enumerate(classes)]
    q, model, pushed = FreshQueue(trajs), list(trajs), list(trajs)
    next_id = len(trajs)
    check_same(q, model, pushed)
    for op, at, cls in ops:
        if op == "take" and model:
            t = model.pop(at % len(model))
            q.take(t)
            with pytest.raises(KeyError):
                q.take(t)
        else:
            t = traj(next_id, cls)
            next_id += 1
            q.push(t)
            model.append(t)
            pushed.append(t)
        check_same(q, model, pushed)
        assert list(q.in_order()) == model   # what successive peeks and takes would give


@settings(max_examples=100, deadline=None)
@given(classes=st.lists(st.sampled_from(CLASSES), min_size=1, max_size=30), taken=st.sets(st.integers(0, 29)),
       together=st.sets(st.integers(0, 29)))
def test_taking_all_at_once_is_taking_each(classes, taken, together):
    trajs = [traj(i, c) for i, c in enumerate(classes)]
    one, lot = FreshQueue(trajs), FreshQueue(trajs)
    for i in sorted(taken & set(range(len(trajs)))):   # taken from anywhere first, so heads must be skipped
        one.take(trajs[i])
        lot.take(trajs[i])
    batch = [trajs[i] for i in sorted(together - taken) if i < len(trajs)]
    for t in batch:
        one.take(t)
    lot.take_all(batch)
    model = [t for i, t in enumerate(trajs) if i not in taken | together]
    check_same(lot, model, trajs)
    check_same(one, model, trajs)
    assert list(lot.in_order()) == list(one.in_order())


def test_taking_a_stranger_is_a_key_error():
    a = traj(0, "rlvr")
    q = FreshQueue([a])
    with pytest.raises(KeyError):
        q.take(traj(0, "rlvr"))      # same id, another trajectory
    with pytest.raises(KeyError):
        q.take(traj(7, "rlhf"))      # a class never seen
    with pytest.raises(ValueError):
        q.push(a)                    # already waiting
    with pytest.raises(KeyError):
        q.take_all([a, a])           # twice in one lot: nothing taken
    with pytest.raises(KeyError):
        q.take_all([a, traj(7, "rlhf")])
    assert len(q) == 1
    q.take(a)
    assert not q and q.peek() is None and q.classes() == []
