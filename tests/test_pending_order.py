"""The pending set's context order is the order a full sort would give, whatever was added and removed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cadencerl.core.pending import PendingSet
from tests.pools import traj

# each step: add trajectory i (context from a small range, so ties are common, version 0 or 1) or remove one
STEPS = st.lists(st.tuples(st.booleans(), st.integers(0, 39), st.integers(11, 16), st.integers(0, 1)), max_size=80)


def built(steps) -> tuple[PendingSet, dict]:
    """The pending set `steps` leave, and its trajectories by id."""
    pending, present = PendingSet(), {}
    for add, i, ctx, version in steps:
        if add and i not in present:
            present[i] = traj(i, ctx, version=version)
            pending.add(present[i])
        elif not add and i in present:
            pending.remove(present.pop(i))
    return pending, present


@settings(max_examples=200, deadline=None)
@given(steps=STEPS)
def test_by_context_matches_a_stable_sort_of_the_departure_order(steps):
    pending, present = built(steps)
    for v in (0, 1):
        departed = pending.at(v)
        assert pending.by_context(v) == sorted(departed, key=lambda t: t.context)
        assert pending.by_context(v, longest_first=True) == sorted(departed, key=lambda t: -t.context)
    assert len(pending) == len(present)


def test_a_trajectory_that_departs_again_goes_behind_its_equals():
    a, b = traj(1, 500), traj(2, 500)
    pending = PendingSet()
    pending.add(a)
    pending.add(b)
    pending.remove(a)
    pending.add(a)
    assert pending.by_context(0) == [b, a] and pending.by_context(0, longest_first=True) == [b, a]


@settings(max_examples=200, deadline=None)
@given(steps=STEPS, bounds=st.lists(st.integers(10, 17), max_size=40))
def test_a_longest_first_walk_passes_over_what_is_longer_than_its_falling_bound(steps, bounds):
    """`longest_first(v).next_within(bound)` gives what a walk of `by_context(v, longest_first=True)`
    gives that skips each trajectory longer than the bound at its turn, the bound falling after each."""
    pending, present = built(steps)
    bounds = sorted(bounds, reverse=True)
    expected, k = [], 0
    for t in pending.by_context(0, longest_first=True):
        if k < len(bounds) and t.context <= bounds[k]:
            expected.append(t)
            k += 1
    walk, got = pending.longest_first(0), []
    for bound in bounds:
        t = walk.next_within(bound)
        if t is None:
            break
        got.append(t)
        pending.remove(t)   # the set changes as the walk goes
    assert got == expected
