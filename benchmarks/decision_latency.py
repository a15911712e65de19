"""How long does one decision take at scale? 64 workers x 256 residents, p50 / p99 per tick.

Usage: PYTHONPATH=. python benchmarks/decision_latency.py [--workers 64] [--residents 256] [--ticks 400]
       [--policy cadence]

The pool is held in a loaded pacing state: every tick each resident grows by one tick of decode,
a few residents finish (the trainer consumes them) and fresh work waits, so each decision evicts,
places and admits as in a long run. There is fresh work and eta budget for every tick (a tick that
finds neither is counted and printed: it would not be pacing). Then the fresh work runs out, as at
the end of a version, and the concentration cascade that follows (pending work placed longest
first) is timed apart: a few ticks per version, not the steady state. The timed part is one whole
`Controller._decide`: refreshing each worker from the backend, the recorder, building the view,
the policy's decision and the controller applying its actions. The backend is a stub that reports
the controller's own books and does nothing, so its cost (the simulator's, or an engine's /metrics)
is not counted.
Goal: p99 under 1 ms (the scale of one decode step's slack). The last line is one JSON object.

Measured at 64 x 256 on 2 cores shared with other runs, alternating 6 runs each with the code
before the batched stream (07f5d23); two other helpers' simulations ran throughout:
  load average 1.9, default scheduling:  p50 0.49-0.51 ms, p99 0.68-0.87 ms (before: p50 0.67-0.76,
  p99 0.99-1.46); the slowest concentration tick 1.29-1.64 ms (before: 1.36-1.90).
  load average 2.0-2.5, `chrt -f 10` (the run keeps its core): p50 0.48-0.53, p99 0.74-0.92 (before:
  p50 0.67-0.74, p99 0.99-1.47).
  quiet machine (load average 0.8, nothing else running, main after the merge of issue 12's spread
  default): p50 0.48-0.53 ms, p99 0.67-0.90 ms (07f5d23: p50 0.68-0.77, p99 1.00-1.38); the
  concentration cascade's slowest tick 1.37-1.87 ms (timed apart, a few ticks per version).
So the goal is met in these 18 runs, with little margin: the p99 of a shared machine moves with
its load (intermediate versions, at load average 3-4.5: p99 up to 1.5 ms, before 2.0). What a
tick costs now: about 0.15 ms
over all workers (the growth probe, one read of every worker's room terms, the floor check, the
room index, the backend refresh) and about 5 us per admission (~2.5 in the policy's stream, ~2.7
applying it), a pacing stream being proposed and applied as one Batch; a tick that sheds adds
~50 us per worker shed (every resident's context is read to find the longest). Plain lists, not
numpy: at 64 workers numpy's conversions cost more than the arithmetic they save (measured: reading
the columns into arrays took longer than the whole list version). Concentration still applies one
action at a time.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from cadencerl.config import ControllerSpec, builtin_scenario
from cadencerl.core.controller import Controller
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.worker import Worker
from cadencerl.runs.registry import make_policy

KEY = object()


class StubBackend:
    """Accepts every action and reports the controller's own books: only the controller's work runs."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []

    def refresh(self, workers, now):
        for w in workers:      # the controller's own books stand: KV as it booked it, an idle engine
            w.engine_kv = w.num_waiting = w.preemptions = 0

    def commit(self, now):
        pass

    def place(self, traj, worker, restore, delay):
        pass

    def evict(self, traj):
        pass

    def set_version(self, worker, version):
        pass

    def schedule(self, time, tag):
        pass


def build(n_workers: int, residents: int, rng: random.Random, policy_name: str,
          ticks: int) -> tuple[TimedController, list]:
    """A controller whose workers each hold `residents` trajectories, near their pacing floor, with
    fresh work for `ticks` decisions (about one admission per worker per tick is taken, twice that
    is queued) and an eta budget that never runs out before it."""
    scenario = builtin_scenario("16a16b8h")
    params = ControllerSpec()
    fresh = [Trajectory(TrajectorySpec(10**7 + i, 10**6 + i // 8, rng.randint(200, 2000), HiddenLength(1, KEY)))
             for i in range(2 * n_workers * ticks)]
    workers, placed = [], []
    tid = 0
    for wid in range(n_workers):
        w = Worker(wid, "A910X", "a", 2, 0, max(residents, 256), rank=wid % 3)
        for _ in range(residents):
            ctx = int(min(16000, rng.lognormvariate(7.8, 0.9)))
            t = Trajectory(TrajectorySpec(tid, tid // 8, min(512, ctx), HiddenLength(10**6, KEY)))
            t.tokens, t.tag, t.versions, t.state, t.worker, t.home = ctx - t.prompt_len, 0, [0], State.RESIDENT, wid, wid
            w.sessions += 1
            t.admitted_at = t.placed_at = 0.0
            w.residents[tid] = t
            w.kv_used += ctx
            placed.append(t)
            tid += 1
        w.kv_capacity = int(w.kv_used * 1.06)  # just above the 5% floor: pacing is active
        workers.append(w)
    backend = StubBackend()
    backend.workers = workers
    ctl = TimedController(make_policy(policy_name, scenario), backend, workers, fresh + placed,
                     batch_size=len(placed) + len(fresh), params=params, train_time_s=10.0)  # eta 1: room for all
    for t in placed:
        ctl.fresh.take(t)
        ctl.credits.record(0)
    ctl.active_by_class["rlvr"] = len(placed)
    return ctl, placed


class TimedController(Controller):
    """Times the applying of actions while `applying` is a list (the compiled controller's method
    takes no patch; a subclass's override is called)."""

    applying: list[float] | None = None

    def apply(self, action, now: float) -> None:
        if self.applying is None:
            super().apply(action, now)
            return
        t0 = time.perf_counter()
        super().apply(action, now)
        self.applying[0] += time.perf_counter() - t0


def tick(ctl: TimedController, now: float, rng: random.Random, split: bool) -> tuple[float, float, int]:
    """Advance the pool by one tick of decode and a few completions, then time one decision:
    (total CPU seconds, of which applying the actions (with `split`, else 0), number of actions)."""
    for w in ctl.workers:
        for t in w.residents.values():
            t.tokens += 12
        w.kv_used += 12 * len(w.residents)
        for _ in range(rng.randint(0, 2)):  # about one completion per worker per tick, as at paper scale
            if len(w.residents) > 1:
                ctl._finish(next(iter(w.residents.values())), now)
    ctl.now = now
    applying = [0.0]
    ctl.applying = applying if split else None
    before = _books(ctl)
    clock = time.process_time  # CPU time: the machine may be shared, wall time would count others' work
    start = clock()
    ctl._decide(now)
    total = clock() - start
    ctl.applying = None
    return total, applying[0], _actions(before, _books(ctl))


def _pacing(ctl: Controller) -> bool:
    """Is there fresh work and eta budget for every worker's version (so CadenceRL paces)?"""
    view = ctl.view(ctl.now)
    return all(view.admissible(w.version) > 0 for w in ctl.workers)


def _cascade(ctl: Controller, now: float, rng: random.Random, limit: int = 40) -> list[tuple[float, float, int]]:
    """The fresh work runs out (the last trajectory of the run is admitted): time the ticks of
    concentration until the pending set is placed (at most `limit`)."""
    while ctl.fresh:
        ctl.fresh.take(ctl.fresh.peek())
    rows = []
    while ctl.pending and len(rows) < limit:
        now += 0.5
        rows.append(tick(ctl, now, rng, False))
    return rows


def _books(ctl: Controller) -> tuple[int, int, int, tuple[int, ...]]:
    return ctl.credits.admitted, ctl.counters.evictions, len(ctl.pending), tuple(w.version for w in ctl.workers)


def _actions(before: tuple, after: tuple) -> int:
    """Admissions, evictions, placements of pending work and advances between two readings of the books."""
    (admitted0, evicted0, pending0, versions0), (admitted1, evicted1, pending1, versions1) = before, after
    evicted = evicted1 - evicted0
    placed = evicted - (pending1 - pending0)
    return admitted1 - admitted0 + evicted + placed + sum(a != b for a, b in zip(versions0, versions1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--residents", type=int, default=256)
    ap.add_argument("--ticks", type=int, default=400)
    ap.add_argument("--policy", default="cadence")
    ap.add_argument("--split", action="store_true",
                    help="also time applying the actions alone (two clock reads per action, counted in the total)")
    args = ap.parse_args()
    rng = random.Random(0)
    warm_up = 20
    ctl, _ = build(args.workers, args.residents, rng, args.policy, warm_up + args.ticks)
    rows, not_pacing = [], 0
    for i in range(warm_up + args.ticks):
        not_pacing += i >= warm_up and not _pacing(ctl)
        rows.append(tick(ctl, 0.5 * (i + 1), rng, args.split))
    rows = rows[warm_up:]
    cascade = _cascade(ctl, 0.5 * (warm_up + args.ticks), rng)
    total = np.array([r[0] for r in rows]) * 1e3
    policy = np.array([r[0] - r[1] for r in rows]) * 1e3
    actions = np.array([r[2] for r in rows])
    out = {"policy": args.policy, "workers": args.workers, "residents_per_worker": args.residents,
           "ticks": len(rows), "p50_ms": float(np.percentile(total, 50)), "p99_ms": float(np.percentile(total, 99)),
           "policy_p50_ms": float(np.percentile(policy, 50)) if args.split else None,
           "policy_p99_ms": float(np.percentile(policy, 99)) if args.split else None,
           "actions_per_tick_mean": float(actions.mean()), "actions_per_tick_max": int(actions.max()),
           "evictions": ctl.counters.evictions, "goal_p99_ms": 1.0, "ticks_not_pacing": not_pacing,
           "cascade_ticks": len(cascade), "cascade_actions": sum(r[2] for r in cascade),
           "cascade_max_ms": max(r[0] for r in cascade) * 1e3 if cascade else None}
    print(f"{args.policy}: {args.workers} workers x {args.residents} residents, {len(rows)} ticks, "
          f"{out['actions_per_tick_mean']:.0f} actions per tick (max {out['actions_per_tick_max']}), CPU time:")
    print(f"  Controller._decide, all of it:   p50 {out['p50_ms']:.3f} ms, p99 {out['p99_ms']:.3f} ms (goal p99 < 1 ms)")
    if args.split:
        print(f"  less applying the actions:       p50 {out['policy_p50_ms']:.3f} ms, "
              f"p99 {out['policy_p99_ms']:.3f} ms")
    if not_pacing:
        print(f"  {not_pacing} timed ticks found no fresh work or no eta budget: not the pacing state")
    if cascade:
        print(f"  then the fresh work runs out: {len(cascade)} ticks of concentration, "
              f"{out['cascade_actions']} actions, the slowest {out['cascade_max_ms']:.3f} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
