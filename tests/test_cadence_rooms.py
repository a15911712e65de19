"""CadenceRL's room index against the plain rules it stands for.

The index is read once per decision and then books each placement itself (it never reads a worker
back), so its answers after any sequence of placements must be the ones the scalar rules give on
the workers as the controller leaves them: `Cadence._spare` for the room, `Cadence.floor` for the
shed check, a scan for tight fit and least loaded.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadencerl.config import CadenceSpec
from cadencerl.policies.cadence import Cadence
from cadencerl.policies.cadence_rooms import RoomIndex
from tests.pools import traj, worker

pytestmark = pytest.mark.timeout(120)

workers_st = st.lists(st.tuples(st.integers(1_000, 50_000),        # KV capacity
                                st.lists(st.integers(10, 4_000), max_size=6),   # resident contexts
                                st.integers(1, 8),                   # sequence slots
                                st.floats(0.0, 400.0)),              # observed tokens/s per resident
                      min_size=1, max_size=8)


def _pool(spec, floor_frac):
    policy = Cadence(CadenceSpec(headroom_floor=floor_frac, delta=0), tick_s=0.5)
    ws, tid = [], 0
    for wid, (cap, contexts, seqs, rate) in enumerate(spec):
        residents = [traj(tid + i, c) for i, c in enumerate(contexts)]
        tid += len(contexts)
        ws.append(worker(wid * 3, cap=cap, residents=residents, seqs=max(seqs, len(contexts))))   # ids need not be dense
        if rate:
            policy.growth._rate[wid * 3] = rate
    return policy, ws


def _tightest(policy, ws, need):
    fits = [w for w in ws if policy._spare(w) >= need]
    return min(fits, key=lambda w: (policy._spare(w), w.id), default=None)


def _least_loaded(policy, ws, need, caps=None):
    fits = [w for w in ws if policy._spare(w) >= need and (caps is None or len(w.residents) < caps[w.id])]
    return min(fits, key=lambda w: (len(w.residents), w.id), default=None)


@settings(max_examples=200, deadline=None)
@given(spec=workers_st, floor_frac=st.sampled_from([0.0, 0.05, 0.1, 0.3]),
       placements=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 3_000)), max_size=12),
       needs=st.lists(st.integers(-1, 40_000), min_size=1, max_size=5))
def test_the_index_answers_as_the_scalar_rules_do_after_any_placements(spec, floor_frac, placements, needs):
    policy, ws = _pool(spec, floor_frac)
    terms = policy._terms(ws)
    assert terms.below_floor() == [i for i, w in enumerate(ws) if len(w.residents) > 1 and w.headroom < policy.floor(w)]
    assert terms.room == [policy._spare(w) for w in ws]
    index = RoomIndex(terms)
    tid = 1_000
    for at, context in placements:
        w = ws[at % len(ws)]
        index.place(w, context)        # booked by the index ...
        t = traj(tid, context)
        tid += 1
        w.residents[t.id] = t          # ... and done as the controller does it
        w.kv_used += context
        for need in needs:
            assert index.tightest(need) is _tightest(policy, ws, need)
            assert index.least_loaded(need) is _least_loaded(policy, ws, need)
            caps = {w.id: 0.5 * need % 7 + w.id % 3 for w in ws}   # arbitrary caps, some under a load, some over
            assert index.least_loaded(need, caps) is _least_loaded(policy, ws, need, caps)
            assert [index.candidate(o.id, need) is o for o in ws] == [policy._spare(o) >= need for o in ws]
        assert [index.load(o) for o in ws] == [len(o.residents) for o in ws]
    fresh = policy._terms(ws)          # reading the workers again gives what was booked
    assert fresh.room == [policy._spare(w) for w in ws]
    for i in range(len(ws)):
        terms.reread(i)
    assert terms.room == fresh.room and terms.free == fresh.free and terms.load == fresh.load


@settings(max_examples=50, deadline=None)
@given(spec=workers_st, keep=st.lists(st.booleans(), min_size=8, max_size=8))
def test_a_subset_index_holds_only_its_workers(spec, keep):
    policy, ws = _pool(spec, 0.05)
    keep = keep[:len(ws)]
    sub = RoomIndex(policy._terms(ws).select(keep))
    chosen = [w for w, k in zip(ws, keep) if k]
    assert [w in sub for w in ws] == keep and len(sub) == len(chosen)
    for need in (0, 500, 5_000):
        assert sub.tightest(need) is _tightest(policy, chosen, need)


def test_an_index_without_a_load_order_refuses_a_least_loaded_pick():
    policy, ws = _pool([(10_000, [100], 4, 0.0)], 0.05)
    with pytest.raises(ValueError, match="no load order"):
        RoomIndex(policy._terms(ws), by_load=False).least_loaded(0)


class _Request:
    """An engine request as a meter reads it (its token count)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def generated(self) -> int:
        return self.n


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 50), st.integers(0, 9), st.integers(0, 60), st.booleans()),
                        min_size=1, max_size=40))
def test_residents_are_shed_longest_first_equal_ones_in_residence_order(lengths):
    from cadencerl.core.trajectory import Meter, contexts
    from cadencerl.policies.cadence import _longest_first

    w = worker(0, cap=10**6)
    for i, (prompt, observed, generated, metered) in enumerate(lengths):
        t = traj(i, prompt + generated, prompt=prompt)
        t.observation_tokens = observed
        if metered:
            t.tokens, t.meter = -1, Meter(_Request(generated))   # the meter, not the field, counts
        w.residents[t.id] = t
    residents = list(w.residents.values())
    assert contexts(residents) == [t.context for t in residents]
    expected = sorted(residents, key=lambda t: t.context, reverse=True)   # a stable sort keeps residence order
    assert list(_longest_first(w)) == expected


@settings(max_examples=200, deadline=None)
@given(spec=workers_st, ranks=st.lists(st.integers(0, 2), min_size=8, max_size=8),
       floor_frac=st.sampled_from([0.0, 0.05, 0.3]), contexts=st.lists(st.integers(1, 20_000), max_size=16))
def test_first_fit_picks_what_a_scan_of_the_affinity_order_picks(spec, ranks, floor_frac, contexts):
    """Concentration's targets (`FirstFit`) against the scan it replaces: pending work longest first,
    each on the first worker in (rank, most headroom, id) order with room, the rest passed over."""
    from cadencerl.policies.cadence_rooms import FirstFit

    policy, ws = _pool(spec, floor_frac)
    for w, rank in zip(ws, ranks):
        w.rank = rank
    fit, placed = FirstFit(ws, policy._spare), 0
    for c in sorted(contexts, reverse=True):
        assert fit.largest() == max(policy._spare(w) for w in ws)
        if c > fit.largest():
            continue
        expected = next(w for w in sorted(ws, key=lambda w: (w.rank, -w.headroom, w.id)) if policy._spare(w) >= c)
        w = fit.first(c)
        assert w is expected
        t = traj(10_000 + placed, c)
        w.residents[t.id], w.kv_used, placed = t, w.kv_used + c, placed + 1
        fit.refile(w)
