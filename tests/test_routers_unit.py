"""The routers and the MISA-T gate on hand-built pools: each one's stated rule, one at a time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cadencerl.admission.gated import Gated
from cadencerl.admission.misa import Admitted, MisaT
from cadencerl.config import ConfigError
from cadencerl.core.actions import Admit, Advance, Interrupt, Place, UpdateInPlace
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.policies.prefix_tree import LINK_TOKENS, PrefixTree
from cadencerl.policies.routers import CacheAware, ConsistentHash, LeastLoadedRouter, RoundRobin, StickyLeastLoaded
from tests.pools import pool, traj, worker


def fresh(n, start=100, ctx=10, group=None, prompt=5):
    return [traj(i, ctx, group=group, prompt=prompt) for i in range(start, start + n)]


def admits(actions):
    return [a.worker for a in actions if isinstance(a, Admit)]


def loaded(wid, n, start=None, **kw):
    """A worker with `n` small residents."""
    base = 1000 * (wid + 1) if start is None else start
    return worker(wid, residents=[traj(i, 10) for i in range(base, base + n)], **kw)


# -- the routing loop every router shares ----------------------------------------------------------

def test_a_router_queues_at_the_engine_but_never_sends_what_its_kv_cannot_hold():
    full = worker(0, cap=10_000, residents=[traj(1, 9000)])
    acts = pool(LeastLoadedRouter(), [full], fresh=[traj(2, 5000)]).decide()
    assert acts == [Admit(0, 2)]                  # past its headroom: the engine's queue holds it
    acts = pool(LeastLoadedRouter(), [worker(0, cap=10_000)], fresh=[traj(3, 10_000)]).decide()
    assert acts == []                             # larger than the whole KV: it could never run


def test_a_router_places_continuations_first_in_departure_order():
    early, late = traj(2, 100), traj(1, 100)
    early.departed_at, late.departed_at = 3.0, 5.0
    acts = pool(RoundRobin(), [worker(0), worker(1)], pending=[late, early], fresh=fresh(1), admitted=2).decide()
    assert acts == [Place(2, 0), Place(1, 1), Admit(0, 100)]


class HoldsWorker1:
    """An admission layer that takes no new session on worker 1 and one in all on worker 0."""

    def open_classes(self, view, version=None):
        return {"rlvr"}

    def accepting(self, view, workers):
        return [w.id == 0 for w in workers]

    def remaining(self, view):
        return max(0, 1 - view.workers[0].sessions)


class Held(Gated):
    def decide(self, view):
        yield from self.inner.decide(view)


def test_a_pinned_request_goes_to_its_worker_or_waits():
    cont = traj(1, 100)
    cont.pin = 1
    acts = pool(LeastLoadedRouter(), [worker(0), loaded(1, 3)], pending=[cont], admitted=1).decide()
    assert acts == [Place(1, 1)]                  # not the least-loaded worker 0: only 1 holds its state
    big = traj(2, 20_000)
    big.pin = 1
    acts = pool(LeastLoadedRouter(), [worker(0, cap=30_000), worker(1)], pending=[big], admitted=1).decide()
    assert acts == []                             # its worker cannot hold it, and no other can serve it


def test_an_admission_layer_does_not_hold_a_pinned_session_nor_those_queued_behind_it():
    """A new session pinned to a worker continues state only that worker holds (a stored response):
    the layer does not hold it, or every new session queued behind it would wait for that worker."""
    pinned, *rest = fresh(3)
    pinned.pin = 1
    acts = pool(Held(HoldsWorker1(), LeastLoadedRouter(), "held"), [worker(0), worker(1)], fresh=[pinned, *rest]).decide()
    assert acts == [Admit(1, 100), Admit(0, 101)]  # then the layer's one slot is taken: 102 waits


class CountingMisaT(MisaT):
    """MISA-T counting its pool-wide sums (each one a pass over every worker)."""

    sums = 0

    def remaining(self, view):
        self.sums += 1
        return super().remaining(view)


@pytest.mark.parametrize("n_workers", [4, 64])
def test_choosing_a_server_for_a_new_session_asks_the_gate_once_not_once_a_server(n_workers):
    """The gate's answer for each candidate shares the pool's sums: asked once a choice, a fleet's
    size is not paid for squared (a 64-server router spent 80% of its CPU there)."""
    misa = CountingMisaT({"rlvr": 1.0})
    acts = pool(Admitted(misa, LeastLoadedRouter()), [worker(i) for i in range(n_workers)], fresh=fresh(8)).decide()
    assert len(admits(acts)) == 8
    assert misa.sums <= 4 * 8 + 2            # a few a choice (the versions open, the candidates, the check)


# -- how a router's workers take new weights ---------------------------------------------------------

def behind_the_trainer():
    """Version 0's budget spent, the trainer at 1: one worker still holds a resident, one is empty."""
    return [loaded(0, 1), worker(1)], dict(trainer_version=1, admitted=100, batch=100, total=1000)


def test_when_idle_a_routers_worker_moves_only_once_it_holds_nothing():
    workers, state = behind_the_trainer()
    acts = pool(CacheAware(), workers, **state).decide()
    assert [a for a in acts if isinstance(a, (Advance, Interrupt))] == [Advance(1, 1)]


def test_interrupting_moves_every_worker_at_publish_residents_and_all():
    workers, state = behind_the_trainer()
    p = pool(CacheAware(version_switch="interrupt"), workers, **state)
    acts = p.decide()
    assert [a for a in acts if isinstance(a, (Advance, Interrupt))] == [Interrupt(0, 1), Interrupt(1, 1)]
    resident = p.controller.workers[0].residents[1000]
    assert resident.versions == [0, 1] and resident.tag == 0   # spans versions, still counts for its start


def test_updating_in_place_moves_every_worker_at_publish_keeping_its_residents():
    workers, state = behind_the_trainer()
    p = pool(CacheAware(version_switch="in-place"), workers, **state)
    acts = p.decide()
    moves = [a for a in acts if isinstance(a, (Advance, Interrupt, UpdateInPlace))]
    assert moves == [UpdateInPlace(0, 1), UpdateInPlace(1, 1)]
    w0 = p.controller.workers[0]
    resident = w0.residents[1000]
    assert w0.version == 1 and resident.worker == 0           # never left its worker
    assert resident.versions == [0, 1] and resident.tag == 0
    assert p.controller.counters.in_place_updates == 2 and p.controller.counters.evictions == 0
    calls = p.controller.backend.calls
    assert ("set_version", 0, 1, "keep_kv") in calls and not any(c[0] == "evict" for c in calls)


def test_an_unknown_weight_update_is_refused_by_name():
    with pytest.raises(ConfigError, match="version_switch: expected one of when-idle, interrupt, in-place, got 'eager'"):
        CacheAware(version_switch="eager")


# -- round-robin, least-loaded, sticky ------------------------------------------------------------

def test_round_robin_cycles_whatever_the_load():
    acts = pool(RoundRobin(), [worker(0), loaded(1, 8), worker(2)], fresh=fresh(4)).decide()
    assert admits(acts) == [0, 1, 2, 0]


def test_least_loaded_router_sends_each_request_to_the_fewest_in_flight():
    acts = pool(LeastLoadedRouter(), [loaded(0, 2), worker(1), loaded(2, 1)], fresh=fresh(3)).decide()
    assert admits(acts) == [1, 1, 2]


def test_sticky_least_loaded_returns_a_session_home_and_starts_new_ones_least_loaded():
    back = traj(1, 100)
    back.home = 2
    ws = [worker(0), loaded(1, 1), loaded(2, 5)]
    acts = pool(StickyLeastLoaded(), ws, pending=[back], fresh=fresh(1), admitted=1).decide()
    assert acts == [Place(1, 2), Admit(0, 100)]   # home though busiest; the new session to the idlest


# -- consistent hashing ---------------------------------------------------------------------------

def test_consistent_hash_moves_only_the_sessions_of_a_lost_worker():
    def route(dead=None, busy=False):
        ws = [loaded(0, 20) if busy else worker(0), worker(1), worker(2), worker(3)]
        if dead is not None:
            ws[dead].alive = False
        return admits(pool(ConsistentHash(), ws, fresh=fresh(40)).decide())

    before = route()
    assert len(set(before)) >= 3                  # sessions spread over the ring
    assert route(busy=True) == before             # load plays no part
    after = route(dead=2)
    assert len(after) == len(before)
    for old, new in zip(before, after):
        assert new == old if old != 2 else new != 2


# -- cache-aware ------------------------------------------------------------------------------------

def test_cache_aware_follows_the_cached_prompt_when_the_match_clears_the_threshold():
    # prompts of 80 tokens in 100: a sibling matches 80% of its request where the group went
    reqs = [traj(100, 100, group=7, prompt=80), traj(101, 100, group=8, prompt=80),
            traj(102, 100, group=9, prompt=80), traj(103, 100, group=7, prompt=80)]
    acts = pool(CacheAware(), [worker(0), worker(1)], fresh=reqs).decide()
    assert admits(acts) == [0, 1, 0, 0]           # the last sibling follows its group, not the idler worker


def test_cache_aware_follows_a_shared_head_across_groups_by_its_prefix_chain():
    """Prompts of different groups whose first 64 of 80 tokens (one link) are the same head: each
    follows the head where it went, as vllm-router's radix tree does; without a chain they spread."""
    def headed(tid: int, head: int, prefix: bool = True):
        t = traj(tid, 80, prompt=80)
        t.spec = replace(t.spec, prefix=(head, tid) if prefix else ())
        return t

    heads = (1, 2, 2, 1, 2)
    reqs = [headed(100 + i, h) for i, h in enumerate(heads)]
    assert admits(pool(CacheAware(), [worker(0), worker(1)], fresh=reqs).decide()) == [0, 1, 1, 0, 1]
    reqs = [headed(100 + i, h, prefix=False) for i, h in enumerate(heads)]
    assert admits(pool(CacheAware(), [worker(0), worker(1)], fresh=reqs).decide()) == [0, 1, 0, 1, 0]
    tree = PrefixTree(1)
    tree.insert(0, group=5, traj=1, prompt_len=200, context=200, prefix=(11, 12, 13))
    assert tree.matched(0, group=6, traj=2, prompt_len=200, context=200, prefix=(11, 12, 99)) == 2 * LINK_TOKENS
    assert tree.matched(0, group=6, traj=2, prompt_len=200, context=200, prefix=(99, 12, 13)) == 0
    assert tree.matched(0, group=6, traj=2, prompt_len=100, context=100, prefix=(11, 12, 13)) == 100
    tree.evict(0)
    assert tree.matched(0, group=6, traj=2, prompt_len=200, context=200, prefix=(11,)) == 0


def test_cache_aware_goes_least_loaded_below_the_match_threshold():
    # prompts of 20 tokens in 100: a 20% match is under the 30% threshold
    reqs = [traj(100, 100, group=7, prompt=20), traj(101, 100, group=8, prompt=20),
            traj(102, 100, group=9, prompt=20), traj(103, 100, group=7, prompt=20)]
    acts = pool(CacheAware(), [worker(0), worker(1)], fresh=reqs).decide()
    assert admits(acts) == [0, 1, 0, 1]


def test_cache_aware_goes_least_loaded_once_the_absolute_imbalance_passes_its_threshold():
    router = CacheAware(balance_abs_threshold=2, balance_rel_threshold=1.5)
    acts = pool(router, [worker(0), worker(1)], fresh=fresh(4, group=7, ctx=100, prompt=80)).decide()
    # siblings stay with their cached prompt while the load gap is <= 2; at 3 - 0 they go least-loaded
    assert admits(acts) == [0, 0, 0, 1]


def test_cache_aware_also_needs_the_relative_imbalance():
    router = CacheAware(balance_abs_threshold=2, balance_rel_threshold=1.5)
    acts = pool(router, [worker(0), loaded(1, 10)], fresh=fresh(17, group=7, ctx=100, prompt=80),
                admitted=10).decide()
    # 13 vs 10 is 3 apart but not 1.5x: the cached worker keeps the siblings until 16 > 1.5 x 10
    assert admits(acts) == [0] * 16 + [1]


# -- MISA-T: the gate in front of placement -----------------------------------------------------------

def misa_pool(workers, **state):
    return pool(Admitted(MisaT({"rlvr": 1.0}), LeastLoaded()), workers, **state)


def test_the_controller_hands_the_policys_gate_to_every_view():
    p = misa_pool([worker(0)])
    assert p.view.gate is p.policy.misa
    assert pool(LeastLoaded(), [worker(0)]).view.gate is None

# the gate's own rules (ramp, pressure, deficits, lending, continuations): tests/test_misa_gate.py
