"""How long does one decision take at scale? 64 workers x 256 residents, p50 / p99 per tick.

Usage: python benchmarks/decision_latency.py [--workers 64] [--residents 256] [--ticks 400] [--policy cadence]

The pool is held in a loaded pacing state: every tick each resident grows by one tick of decode,
a few residents finish (the trainer consumes them) and fresh work waits, so each decision evicts,
places and admits as in a long run. The timed part is the policy's decision plus the controller
applying its actions, as `Controller._decide` runs them; the backend is a stub that does nothing.
Goal: p99 under 1 ms (the scale of one decode step's slack). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from cadencerl.config import PolicySpec, builtin_scenario
from cadencerl.core.controller import Controller
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.worker import Worker
from cadencerl.runs.registry import make_policy

KEY = object()


class StubBackend:
    """Accepts every action: only the controller's own bookkeeping runs."""

    def place(self, traj, worker, restore, delay):
        pass

    def evict(self, traj):
        pass

    def set_version(self, worker, version):
        pass

    def schedule(self, time, tag):
        pass


def build(n_workers: int, residents: int, rng: random.Random, policy_name: str) -> tuple[Controller, list]:
    """A controller whose workers each hold `residents` trajectories, near their pacing floor."""
    scenario = builtin_scenario("16a16b8h")
    params = PolicySpec()
    fresh = [Trajectory(TrajectorySpec(10**7 + i, 10**6 + i // 8, rng.randint(200, 2000), HiddenLength(1, KEY)))
             for i in range(20_000)]
    workers, placed = [], []
    tid = 0
    for wid in range(n_workers):
        w = Worker(wid, "A910X", "a", 2, 0, max(residents, 256), affinity=wid % 3)
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
    ctl = Controller(make_policy(policy_name, scenario), StubBackend(), workers, fresh + placed,
                     batch_size=len(placed), params=params, train_time_s=10.0)  # eta 1: a batch of fresh room
    for t in placed:
        ctl.fresh.take(t)
        ctl.credits.record(0)
    ctl.active_by_class["rlvr"] = len(placed)
    return ctl, placed


def tick(ctl: Controller, now: float, rng: random.Random) -> tuple[float, float, int]:
    """Advance the pool by one tick of decode and a few completions, then time one decision:
    (total CPU seconds, of which applying the actions, number of actions)."""
    for w in ctl.workers:
        for t in w.residents.values():
            t.tokens += 12
        w.kv_used += 12 * len(w.residents)
        for _ in range(rng.randint(0, 2)):  # about one completion per worker per tick, as at paper scale
            if len(w.residents) > 1:
                ctl._finish(next(iter(w.residents.values())), now)
    ctl.now = now
    view = ctl.view(now)
    applying, n = 0.0, 0
    clock = time.process_time  # CPU time: the machine may be shared, wall time would count others' work
    start = clock()
    for action in ctl.policy.decide(view):
        t0 = clock()
        ctl.apply(action, now)
        applying += clock() - t0
        n += 1
    return clock() - start, applying, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--residents", type=int, default=256)
    ap.add_argument("--ticks", type=int, default=400)
    ap.add_argument("--policy", default="cadence")
    args = ap.parse_args()
    rng = random.Random(0)
    ctl, _ = build(args.workers, args.residents, rng, args.policy)
    rows = [tick(ctl, 0.5 * (i + 1), rng) for i in range(args.ticks + 20)][20:]  # after the warm-up
    total = np.array([r[0] for r in rows]) * 1e3
    policy = np.array([r[0] - r[1] for r in rows]) * 1e3
    actions = np.array([r[2] for r in rows])
    out = {"policy": args.policy, "workers": args.workers, "residents_per_worker": args.residents,
           "ticks": len(rows), "p50_ms": float(np.percentile(total, 50)), "p99_ms": float(np.percentile(total, 99)),
           "policy_p50_ms": float(np.percentile(policy, 50)), "policy_p99_ms": float(np.percentile(policy, 99)),
           "actions_per_tick_mean": float(actions.mean()), "actions_per_tick_max": int(actions.max()),
           "evictions": ctl.counters.evictions, "goal_p99_ms": 1.0}
    print(f"{args.policy}: {args.workers} workers x {args.residents} residents, {len(rows)} ticks, "
          f"{out['actions_per_tick_mean']:.0f} actions per tick (max {out['actions_per_tick_max']}), CPU time:")
    print(f"  decision + controller applying it: p50 {out['p50_ms']:.3f} ms, p99 {out['p99_ms']:.3f} ms (goal p99 < 1 ms)")
    print(f"  the policy alone:                  p50 {out['policy_p50_ms']:.3f} ms, p99 {out['policy_p99_ms']:.3f} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
