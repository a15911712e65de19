"""CadenceRL: reshape the workload instead of estimating each move's benefit (paper section 4, App. B).

Per policy version, while fresh work remains under the admission budget its workers **pace**: a
worker below its headroom floor evicts its longest resident to the pending set (long out), then
pending and fresh work is placed shortest first (short in), at the prompt's home if feasible, else
by tight fit, leaving the floor plus the decode reserve delta. Once the budget is spent they
**concentrate**: pending work longest first onto the highest-affinity workers, and, only with the
pending set empty, the lowest-affinity worker drains and advances. Where the paper is silent, each
choice is a `CadenceSpec` option (config/cadence.py; what each does and was measured for it:
docs/policies/cadence.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from mypy_extensions import mypyc_attr

from cadencerl.config import CadenceSpec
from cadencerl.core.actions import Action, Admit, Advance, Batch, Evict, Place
from cadencerl.core.policy import Policy
from cadencerl.core.trajectory import Trajectory, contexts
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.base import PromptHomes
from cadencerl.policies.cadence_rooms import FirstFit, RoomIndex, RoomTerms
from cadencerl.policies.decode_share import DecodeRate
from cadencerl.policies.growth import GrowthMeter


@mypyc_attr(allow_interpreted_subclasses=True)
class Cadence(Policy):
    def __init__(self, params: CadenceSpec, tick_s: float, name: str = "cadence",
                 decode_rate: DecodeRate | None = None) -> None:
        """`decode_rate`: the pool's, for `spread.share_by: decode` (without it shares follow KV)."""
        self.name = name
        self.params = params
        self.decode_rate = decode_rate if params.spread.share_by == "decode" else None
        self.delta = params.delta
        self.floor_frac = params.headroom_floor
        self.kv_transfer = params.kv_preparation
        self.growth = GrowthMeter(tick_s * params.growth_ticks, params.growth_window_s or 0.0)
        self.homes = PromptHomes() if params.prompt_affinity else None
        self.kv_bound: set[int] = set()   # versions under which a worker had to shed below its floor
        self.paced_bound: set[int] = set()   # ... while the version paced (not while it concentrated)
        self.kv_staging = params.kv_preparation   # late-bound: staged on relays at departure (section 4.4)

    def floor(self, w: Worker, residents: int | None = None) -> int:
        """Headroom to keep: the base floor plus the growth of `residents` until the next decision."""
        n = len(w.residents) if residents is None else residents
        return int(self.floor_frac * w.kv_capacity) + self.growth.tokens(w, n)

    def _spare(self, w: Worker) -> int:
        """Room for one more trajectory above the floor (with its growth); -1 without a free slot.
        The reference for the room terms `cadence_rooms` computes in bulk for pacing (a hypothesis
        test holds them to it); concentration reads it directly."""
        load = len(w.residents)
        if load >= w.max_num_seqs:
            return -1
        growth = int((load + 1) * self.growth.per_resident(w))
        return w.kv_capacity - w.kv_used - int(self.floor_frac * w.kv_capacity) - growth

    # -- the decision ---------------------------------------------------------------------------

    def decide(self, view: PoolView) -> Iterator[Action]:
        self.growth.observe(view)
        groups: dict[int, list[Worker]] = {}
        for w in view.workers:
            if w.alive:
                groups.setdefault(w.version, []).append(w)
        # Newest first: fresh work goes to the workers already at its version, so an older version's
        # drain sees only the fresh work they could not take (what a drained worker would run).
        for v in sorted(groups, reverse=True):
            if view.budget(v) > 0 or not self._concentrates(groups[v]):
                yield from self._pace(view, v, groups[v])
            else:
                yield from self._concentrate(view, v, groups[v])
        yield from self._advance(view)

    def _concentrates(self, workers: list[Worker]) -> bool:
        """Does this version's tail have a higher-affinity worker to go to (or is that not asked)?"""
        if not self.params.concentration:
            return False
        return self.params.drain.within_one_rank or len({w.rank for w in workers}) > 1

    def _shed(self, workers: list[Worker], terms: RoomTerms | None = None, pacing: bool = False) -> Iterator[Action]:
        """Long out: a worker below its floor evicts its longest resident, never its last one.
        One pass over the read terms finds the workers below their floor; only those are looked at."""
        if not self.params.pacing:
            return
        terms = terms or self._terms(workers)
        for i in terms.below_floor():
            yield from self._shed_below(workers[i], pacing)
            terms.reread(i)

    def _shed_below(self, w: Worker, pacing: bool, above_floor: int = 0) -> Iterator[Action]:
        """Evict `w`'s longest residents, never its last, until its headroom clears its floor (as it
        stands after each eviction) plus `above_floor`; each records that KV bound under its version
        (`pacing`: while the version paced)."""
        longest = None
        while len(w.residents) > 1 and w.headroom < self.floor(w) + above_floor:
            self.kv_bound.add(w.version)
            if pacing:
                self.paced_bound.add(w.version)
            longest = longest or _longest_first(w)
            victim = next(longest, None)
            if victim is None:
                return          # the rest cannot leave: their clients do not resume a request
            yield Evict(victim.id)

    def _terms(self, workers: list[Worker]) -> RoomTerms:
        return RoomTerms.read(workers, self.growth.rates, self.floor_frac, self.growth.horizon_s)

    # -- pacing ---------------------------------------------------------------------------------

    def _pace(self, view: PoolView, v: int, workers: list[Worker]) -> Iterator[Action]:
        terms = self._terms(workers)
        yield from self._shed(workers, terms, pacing=True)   # each applied before the next is chosen; `terms` kept up
        # Without an admission layer nothing is applied before the stream ends: its pending work is
        # read in place; with one, each placement leaves the set as the stream goes, so it is copied.
        pending = view.pending.shortest_first(v) if view.gate is None else iter(view.pending.by_context(v))
        spread = self.params.spread.when_underloaded and not view.pending.count(v)
        every = RoomIndex(terms, by_load=spread)
        newcomers = every
        if view.gate is not None:
            newcomers = RoomIndex(terms.select(view.accepting_new(workers)), by_load=spread)
        stream = self._stream(view, v, pending, every, newcomers, spread)
        if view.gate is not None:   # the admission layer sees each admission before the next is chosen
            for tid, wid, admit in stream:
                yield Admit(wid, tid) if admit else Place(tid, wid)
        else:
            steps = list(stream)
            if steps:
                yield Batch(*zip(*steps))

    def _stream(self, view: PoolView, v: int, pending: Iterator[Trajectory], every: RoomIndex, newcomers: RoomIndex,
                spread: bool) -> Iterator[tuple[int, int, bool]]:
        """Shortest first over fresh and pending work; feasibility is monotone in length, so the first
        trajectory that fits nowhere ends its stream. Each placement is booked in the indexes, never
        read back from a worker, so the stream may be applied as it goes or all at once. Yields
        (trajectory id, worker id, admitted fresh?)."""
        pick = RoomIndex.least_loaded if spread else RoomIndex.tightest
        residents = every.total_load() if spread else 0   # the mean load a home is held to
        gated = view.gate is not None
        # The budget falls by one per admission (every credit constraint at or above v does), so
        # without an admission layer it is read once; with one it is re-read every time (the layer
        # holds its own count), which the layer's view of each admission as it is applied allows.
        fresh_in_order: Iterator[Trajectory] = iter(()) if gated else view.fresh_in_order()
        budget, fresh, fresh_context = view.admissible(v), None, 0
        nxt = next(pending, None)
        nxt_context = nxt.context if nxt is not None else 0
        delta = self.delta
        # how far a prompt's home is followed (binds are recorded only by shedding, before the stream)
        rule = self._home_rule(v) if spread else "home-first"
        shares = None   # held to a fair share only until KV stays bound (then every version binds)
        if self.params.spread.fair_share and rule != "home-first":
            shares = self._fair_shares(view, v)
        while True:
            if gated:
                if budget >= 0:
                    budget = view.admissible(v) or -1  # -1: no more fresh work this decision
                fresh = view.next_fresh(v) if budget > 0 else None
                fresh_context = fresh.context if fresh is not None else 0
            elif budget == 0:
                budget = -1
            elif budget > 0 and fresh is None:
                fresh = next(fresh_in_order, None)
                fresh_context = fresh.context if fresh is not None else 0
            if fresh is None and nxt is None:
                return
            context = fresh_context
            is_fresh = fresh is not None and (nxt is None or context <= nxt_context)
            if is_fresh:
                traj, index = fresh, newcomers
            else:
                traj, index, context = nxt, every, nxt_context
            need = context + delta
            assert traj is not None     # fresh or pending work is left (else the stream returned)
            if rule != "home-first":   # None: no feasible worker under its share, the rest waits
                w = self._spread_pick(rule, traj, index, need, residents / len(every), shares if is_fresh else None)
            else:
                w = self._home(traj, index, need) or pick(index, need)
            if w is None:
                if is_fresh:
                    budget, fresh = -1, None
                else:
                    nxt = None  # nothing longer fits either
                continue
            self._note(traj, w)
            residents += 1
            every.place(w, context)   # `index` is `every` or a subset of it
            if newcomers is not every and w in newcomers:
                newcomers.place(w, context)
            if is_fresh:
                budget -= 1
                fresh = None
            else:
                nxt = next(pending, None)
                nxt_context = nxt.context if nxt is not None else 0
            yield traj.id, w.id, is_fresh
            # applied by now: a session that started on `w` or moved its home there may fill its cap
            if gated and w in newcomers and not view.accepts_new(w):
                newcomers.remove(w)

    def _fair_shares(self, view: PoolView, v: int) -> dict[int, float]:
        """Each live worker's share of the pool's residents plus the fresh work admissible under `v`, in
        proportion to its weight (`_share_weights`) and scaled by `spread.fair_share`: while spreading, a
        worker admits fresh work only up to it, so the first worker to reach a version does not take the
        whole budget."""
        live = view.alive()
        residents = sum(len(w.residents) for w in live)
        per_worker = int(self.params.spread.fair_share * (residents + max(view.admissible(v), 0)) / len(live)) + 1
        weights = self._share_weights(live, residents)
        mean = sum(weights) / len(live)
        return {w.id: per_worker * weight / mean for w, weight in zip(live, weights)}

    def _share_weights(self, live: list[Worker], residents: int) -> list[float]:
        """KV capacity, or with `spread.share_by: decode` what each worker decodes with its KV full at
        the pool's mean committed context (the decode reserve while the pool is empty), in whole tokens
        per second as KV is in whole tokens: equal workers then get exactly equal shares, where a
        float's rounding would move a share across a whole resident."""
        rate = self.decode_rate
        if rate is not None:
            context = sum(w.kv_used for w in live) // residents if residents else self.delta
            rates = [rate(w, context) for w in live]
            if all(r is not None for r in rates):
                return [float(max(1, round(r or 0.0))) for r in rates]
        return [float(w.kv_capacity) for w in live]

    def _spread_pick(self, rule: str, traj: Trajectory, index: RoomIndex, need: int, mean_load: float,
                     caps: dict[int, float] | None) -> Worker | None:
        """While the home is not taken whenever feasible (`rule`, from `_home_rule`): the prompt's home
        while it is no hot spot (docs/policies/cadence.md, `spread.home`), else the least-loaded feasible worker;
        with `caps`, only a worker under its fair share, else None."""
        w = index.least_loaded(need, caps)
        home = self._home(traj, index, need)
        if home is None or w is None:
            return w
        load = index.load(home)
        if caps is not None and load >= caps[home.id]:
            return w
        in_bounds = rule == "capped" and load + 1 <= mean_load
        return home if in_bounds or load == index.load(w) else w

    def _home_rule(self, v: int) -> str:
        """How far a prompt's home is followed while spreading under version `v`: "home-first",
        "capped" (up to the mean load) or "tie-break" (only among the least loaded)."""
        spread = self.params.spread
        when = spread.home_first_when
        if when == "kv-stays-bound":
            bound = self._kv_stays_bound(v) or self._kv_stays_bound(v - 1)
        else:
            bound = when == "kv-binds" and (v in self.kv_bound or v - 1 in self.kv_bound)
        return "home-first" if spread.home == "first" or bound else spread.home

    def _kv_stays_bound(self, v: int) -> bool:
        """KV bound under `v` and under the version before it (version 0 has none before it)."""
        return v in self.kv_bound and (v <= 0 or v - 1 in self.kv_bound)

    def _home(self, traj: Trajectory, index: RoomIndex, need: int) -> Worker | None:
        """Prompt affinity: the worker the last sample of this prompt went to, if it is a feasible candidate."""
        if self.homes is None:
            return None
        wid = self.homes.get(traj.spec.group)
        return None if wid is None else index.candidate(wid, need)

    def _note(self, traj: Trajectory, w: Worker) -> None:
        if self.homes is not None:
            self.homes.note(traj.spec.group, w.id)

    # -- concentration --------------------------------------------------------------------------

    def _may_drain(self, v: int) -> bool:
        """Whether version `v`'s workers may drain: with `drain.needs_kv_bind`, only once KV bound
        under it (by default: while it paced); before that there is no displaced tail, and its
        workers drain by themselves."""
        drain = self.params.drain
        if not drain.needs_kv_bind:
            return True
        return v in (self.paced_bound if drain.bind_while_pacing else self.kv_bound)

    def _concentrate(self, view: PoolView, v: int, workers: list[Worker]) -> Iterator[Action]:
        yield from self._shed(workers)
        yield from self._place_longest_first(view, v, workers)
        if view.pending.count(v):
            return  # the gate: a cascade resolves before another begins
        if self.params.drain.needs_fresh_ahead and not _fresh_ahead(view, v):
            return
        if not self._may_drain(v):
            return
        for src in sorted((w for w in workers if w.residents), key=lambda w: (-w.rank, w.kv_used, w.id)):
            # Work only moves up the affinity order; between equals it consolidates onto fuller workers.
            targets = [w for w in workers if w.rank < src.rank
                       or (w.rank == src.rank and w is not src and (w.kv_used, w.id) > (src.kv_used, src.id))]
            if not targets or (self.params.drain.whole_source and not self._absorbs(targets, src)) \
                    or not all(t.resumable for t in src.residents.values()):
                continue
            for traj in sorted(src.residents.values(), key=lambda t: -t.context):
                yield Evict(traj.id)
            yield from self._place_longest_first(view, v, targets)
            return

    def _absorbs(self, targets: list[Worker], src: Worker) -> bool:
        room = sum(max(0, self._spare(w)) for w in targets)
        slots = sum(w.max_num_seqs - w.load for w in targets)
        return room >= src.kv_used and slots >= src.load

    def _place_longest_first(self, view: PoolView, v: int, workers: list[Worker]) -> Iterator[Action]:
        """Pending work of `v`, longest first, each on the first of `workers` in (affinity, most
        headroom) order with room for it; what fits nowhere is passed over. A placement changes only
        the worker it went to, so only that one is re-filed in the order (`FirstFit`)."""
        if not view.pending.count(v):
            return
        targets = FirstFit(workers, self._spare)
        walk = view.pending.longest_first(v)
        while (traj := walk.next_within(targets.largest())) is not None:
            w = targets.first(traj.context)
            self._note(traj, w)
            yield Place(traj.id, w.id)
            targets.refile(w)

    # -- advancing ------------------------------------------------------------------------------

    def _advance(self, view: PoolView) -> Iterator[Action]:
        for w in view.workers:
            if not w.alive or not view.may_advance(w) or view.budget(w.version) > 0:
                continue
            yield Advance(w.id, self._next_version(view, w))

    def _next_version(self, view: PoolView, w: Worker) -> int:
        """Join an intermediate version first if weaker-affinity workers there still hold its tail and
        may drain it (otherwise the joiner would only wait there, a version behind)."""
        for u in range(w.version + 1, view.trainer_version):
            if view.budget(u) == 0 and self._may_drain(u) and any(
                    o.version == u and o.residents and o.rank > w.rank for o in view.alive()):
                return u
        return view.trainer_version


def _longest_first(w: Worker) -> Iterator[Trajectory]:
    """`w`'s residents that may leave, longest first (equal ones in residence order), read as they are
    evicted: each context is read once, one scan finds the first, and only a second eviction sorts the rest.
    A backend that keeps this order (`Worker.longest_first`) gives it without reading them."""
    if w.longest_first is not None:
        yield from w.longest_first()
        return
    residents = [t for t in w.residents.values() if t.resumable]
    if not residents:
        return
    lengths = contexts(residents)
    first = lengths.index(max(lengths))
    yield residents[first]
    rest = sorted(range(len(residents)), key=lengths.__getitem__, reverse=True)   # stable: equal ones in order
    yield from (residents[i] for i in rest if i != first)


def _fresh_ahead(view: PoolView, v: int) -> bool:
    return any(view.budget(u) > 0 for u in range(v + 1, view.trainer_version + 1))
