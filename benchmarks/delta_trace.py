"""What decides whether a larger decode reserve delta raises CadenceRL's P95? (issue 12)

Usage: python benchmarks/delta_trace.py [--setups 8b-hetero,14b-hetero,14b-h800,...] [--deltas 512,1024,2048,4096]
           [--jobs J] [--shed-at-reserve] [--out PATH]

Results go to benchmarks/results/delta_trace.json, or with --shed-at-reserve (a variant, not the
policy as registered) to delta_trace_shed_at_reserve.json, so the variant never overwrites them.

Runs CadenceRL in steady state (16 iterations of batch 4,096, figures over iterations 2..15) for each
delta on each setup and prints, per run: steady throughput, P95 from admission and from submission,
evictions, the non-resident P95, and where delta enters the decisions:

* `delta-blocked`: placements of the stream that no worker could take with the reserve but one could
  without it (delta alone refused them), as a share of all placement searches;
* `KV/worker`: the smallest and largest worker KV capacity (tokens), the scale delta is set against;
* for the trajectories at or above the steady P95 (from admission): the share of their latency spent
  pending (evicted, waiting for a worker with room for context + delta) and their mean evictions.

Setups: the built-in 16a16b8h (Qwen3-8B) and the same pool and workload with Qwen3-14B (the model of
the paper's delta sweep, section 6.3), and the homogeneous 16 H800 pool with Qwen3-14B (the paper's
homogeneous 14B runs), and that pool with a decision every 2 s (the growth between decisions then
exceeds every delta swept) and at batch 1,024 (eta binds, not KV). The counting index and the
tracing policy are subclasses installed for this process only; the policy decides exactly as `cadence` does. What the figures show: README, "The
decode reserve delta".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if __name__ == "__main__":   # it subclasses the room index to count, which the compiled simulator (`make native`)
    os.environ["CADENCERL_PURE_PYTHON"] = "1"   # does not allow: plain Python, here and in its workers

from cadencerl.config import Scenario, builtin_scenario  # noqa: E402
from cadencerl.core.actions import Batch, Evict, Place  # noqa: E402
from cadencerl.core.trajectory import State  # noqa: E402
from cadencerl.core.worker import Worker  # noqa: E402
from cadencerl.policies import cadence as cadence_module  # noqa: E402
from cadencerl.policies.cadence import Cadence  # noqa: E402
from cadencerl.policies.cadence_rooms import RoomIndex  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402
from cadencerl.runs.steady import steady_view, steady_window  # noqa: E402

STEADY = dict(workload={"trajectories": 65536}, trainer={"batch_size": 4096})
H800_14B = dict(name="h800-16-14b", model="Qwen3-14B",
                pool=[{"accelerator": "H800", "devices": 16, "tp": 1, "cluster": "h800"}])
SETUPS = {
    "8b-hetero": ("16a16b8h", {}),
    "14b-hetero": ("16a16b8h", dict(name="16a16b8h-14b", model="Qwen3-14B")),
    "14b-h800": ("h800-16", H800_14B),
    # the same with a decision every 2 s: a worker's growth between decisions (~4x) dwarfs every delta swept
    "14b-h800-tick2": ("h800-16", dict(H800_14B, controller={"tick_s": 2.0})),
    # the same at batch 1,024 (16 iterations of it): eta binds, not KV
    "14b-h800-b1024": ("h800-16", dict(H800_14B, workload={"trajectories": 16384}, trainer={"batch_size": 1024})),
}


class CountingIndex(RoomIndex):
    """RoomIndex that counts the searches the reserve alone refused (the stream asks for context + delta)."""

    delta = 0
    searches = 0
    blocked = 0

    def _count(self, found, need: int, search) -> None:
        CountingIndex.searches += 1
        if found is None and search(need - CountingIndex.delta) is not None:
            CountingIndex.blocked += 1

    def tightest(self, need: int):
        found = super().tightest(need)
        self._count(found, need, super().tightest)
        return found

    def least_loaded(self, need: int, caps=None):
        found = super().least_loaded(need, caps)
        self._count(found, need, lambda n: super(CountingIndex, self).least_loaded(n, caps))
        return found


class TracingCadence(Cadence):
    """CadenceRL as registered, recording what each decision did: the wait of every pending trajectory
    it placed (and whether pacing or concentration placed it), every trajectory's placements and
    evictions (shed: below the floor; drain: concentration), and, at each shed, the worker's growth
    over one decision (what the floor's growth term covers) to set beside delta."""

    def __init__(self, params, name: str = "cadence") -> None:
        super().__init__(params, name)
        self.waits: dict[str, list[tuple[float, int]]] = {"pacing": [], "concentration": []}
        self.shed_growth: list[int] = []
        self.life: dict[int, list[tuple[float, str, int]]] = {}   # trajectory -> (time, event, context)
        self.now = 0.0

    def decide(self, view):
        self.now = view.now
        pending = {t.id: t for t in view.pending}
        for a in super().decide(view):
            placed = list(zip(a.trajs, a.admits)) if isinstance(a, Batch) else [(a.traj, False)] if isinstance(a, Place) else []
            for tid, admit in placed:
                t = pending.get(tid)
                if t is None:
                    continue
                self.life.setdefault(tid, []).append((view.now, "placed", t.context))
                if not admit:
                    phase = "pacing" if view.admissible(t.version) > 0 or not self._concentrates(
                        [w for w in view.workers if w.alive and w.version == t.version]) else "concentration"
                    self.waits[phase].append((view.now - t.departed_at, t.context))
            yield a

    def _evicted(self, workers, a: Evict, event: str) -> Worker:
        w = next(w for w in workers if a.traj in w.residents)
        self.life.setdefault(a.traj, []).append((self.now, event, w.residents[a.traj].context))
        return w

    def _shed(self, workers, terms=None, pacing=False):
        for a in super()._shed(workers, terms, pacing):
            w = self._evicted(workers, a, "shed")
            self.shed_growth.append(self.growth.tokens(w, len(w.residents)))
            yield a

    def _concentrate(self, view, v, workers):
        for a in super()._concentrate(view, v, workers):
            if isinstance(a, Evict):
                life = self.life.get(a.traj, [])
                if not life or life[-1][:2] != (self.now, "shed"):
                    self._evicted(workers, a, "drain")
            yield a


class ShedAtReserve(TracingCadence):
    """The other reading of "the pacing decode reserve" (section 4.3), tried and not kept: pacing also
    sheds below floor + delta, not below the floor (section 4.2 says the floor), so delta leaves no band."""

    def _pace(self, view, v, workers):
        for w in workers:
            for a in self._shed_below(w, pacing=True, above_floor=self.delta):
                self._evicted(workers, a, "shed")
                self.shed_growth.append(self.growth.tokens(w, len(w.residents)))
                yield a
        yield from super()._pace(view, v, workers)


def scenario(setup: str, delta: int) -> Scenario:
    base, changes = SETUPS[setup]
    changes = {**STEADY, **changes, "cadence": {**changes.get("cadence", {}), "delta": delta}}
    return builtin_scenario(base).with_overrides(**changes)


def run_one(setup: str, delta: int, probe: int | None = None, shed_at_reserve: bool = False) -> dict:
    """One run's figures; `probe`: the trajectory whose life to return (None: the one at this run's P95)."""
    cadence_module.RoomIndex = CountingIndex
    CountingIndex.delta, CountingIndex.searches, CountingIndex.blocked = delta, 0, 0
    s = scenario(setup, delta)
    keep: dict = {}
    policy = (ShedAtReserve if shed_at_reserve else TracingCadence)(make_policy("cadence", s).params)
    r = simulate(s, policy, keep=keep)
    ctl = keep["controller"]
    steady = steady_view(r)
    window = steady_window(ctl.trainer.publish_times, s.workload.trajectories // s.trainer.batch_size)
    done = [t for t in ctl.trajectories.values() if t.state is State.DONE
            and window is not None and window[0] <= t.completed_at <= window[1]]
    lat = np.array([t.completed_at - t.admitted_at for t in done])
    pend = np.array([max(0.0, t.completed_at - t.admitted_at - t.resident_time) for t in done])
    evicted = np.array([t.placements - 1 for t in done])
    tail = lat >= np.percentile(lat, 95)
    if probe is None:
        probe = done[int(np.argmin(np.abs(lat - np.percentile(lat, 95))))].id
    t = ctl.trajectories[probe]
    life = {"id": probe, "latency_s": t.completed_at - t.admitted_at, "admitted_s": t.admitted_at,
            "resident_s": t.resident_time, "final_context": t.context, "events": policy.life.get(probe, [])}
    return {"setup": setup, "delta": delta, "shed_at_reserve": shed_at_reserve, "throughput_tok_s": steady["throughput_tok_s"],
            "p95_admission_s": steady["latency_p95_s"], "p95_submission_s": steady["latency_from_submit_p95_s"],
            "evictions": r["evictions"], "preemptions": r["preemptions"], "non_resident_p95": steady["non_resident_p95"],
            "searches": CountingIndex.searches, "delta_blocked": CountingIndex.blocked,
            "kv_min": min(w.kv_capacity for w in ctl.workers), "kv_max": max(w.kv_capacity for w in ctl.workers),
            "tail_pending_share": float(pend[tail].sum() / max(lat[tail].sum(), 1e-9)),
            "tail_mean_evictions": float(evicted[tail].mean()),
            "evicted_share": float((evicted > 0).mean()),
            **{f"{phase}_placed": len(w) for phase, w in policy.waits.items()},
            **{f"{phase}_wait_p50_s": _q([x for x, _ in w], 50) for phase, w in policy.waits.items()},
            **{f"{phase}_wait_p95_s": _q([x for x, _ in w], 95) for phase, w in policy.waits.items()},
            **{f"{phase}_context_p50": _q([c for _, c in w], 50) for phase, w in policy.waits.items()},
            "shed_growth_p50": _q(policy.shed_growth, 50), "shed": len(policy.shed_growth),
            "drained": sum(e[1] == "drain" for ev in policy.life.values() for e in ev), "probe": life}


def _q(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--deltas", default="512,1024,2048,4096")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--shed-at-reserve", action="store_true", help="pacing sheds below floor + delta (ShedAtReserve)")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/delta_trace[_shed_at_reserve].json")
    args = ap.parse_args()
    setups = args.setups.split(",")
    unknown = [x for x in setups if x not in SETUPS]
    if unknown:
        sys.exit(f"setups: unknown {unknown} (known: {', '.join(SETUPS)})")
    deltas = [int(d) for d in args.deltas.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        first = dict(zip(setups, pool.map(run_one, setups, [deltas[0]] * len(setups), [None] * len(setups),
                                          [args.shed_at_reserve] * len(setups))))
        rest = [(s, d, first[s]["probe"]["id"], args.shed_at_reserve) for s in setups for d in deltas[1:]]
        later = iter(pool.map(run_one, *zip(*rest))) if rest else iter(())
    rows = [first[s] if d == deltas[0] else next(later) for s in setups for d in deltas]
    print(f"{'setup':<11}{'delta':>6}{'tok/s':>9}{'P95 adm':>9}{'P95 sub':>9}{'evict':>7}{'preempt':>8}"
          f"{'nonres95':>9}{'blocked':>14}{'KV/worker':>16}{'tail pend':>10}{'tail ev':>8}")
    for r in rows:
        print(f"{r['setup']:<11}{r['delta']:>6}{r['throughput_tok_s']:>9.0f}{r['p95_admission_s']:>9.0f}"
              f"{r['p95_submission_s']:>9.0f}{r['evictions']:>7}{r['preemptions']:>8}{r['non_resident_p95']:>9.1%}"
              f"{r['delta_blocked']:>6}/{r['searches']:<7}{r['kv_min']:>8}-{r['kv_max']:<7}"
              f"{r['tail_pending_share']:>10.1%}{r['tail_mean_evictions']:>8.2f}")
    print(f"\n{'setup':<11}{'delta':>6}{'growth/tick at shed':>20}{'placed from pending: pacing':>29}"
          f"{'wait p50/p95 s':>16}{'ctx p50':>8}{'concentration':>15}{'wait p50/p95 s':>16}{'ctx p50':>8}")
    for r in rows:
        print(f"{r['setup']:<11}{r['delta']:>6}{r['shed_growth_p50']:>20.0f}{r['pacing_placed']:>29}"
              f"{r['pacing_wait_p50_s']:>8.1f}/{r['pacing_wait_p95_s']:<7.1f}{r['pacing_context_p50']:>8.0f}"
              f"{r['concentration_placed']:>15}{r['concentration_wait_p50_s']:>8.1f}/{r['concentration_wait_p95_s']:<7.1f}"
              f"{r['concentration_context_p50']:>8.0f}")
    print("\nThe trajectory at the first delta's steady P95, in every run (events: time s, what, context tokens):")
    for r in rows:
        p = r["probe"]
        events = " ".join(f"{t:.0f}:{e[0]}{c}" for t, e, c in p["events"])
        print(f"{r['setup']} delta {r['delta']}: #{p['id']} admitted {p['admitted_s']:.0f} s, latency {p['latency_s']:.0f} s, resident "
              f"{p['resident_s']:.0f} s, shed {r['shed']} / drained {r['drained']} in the run | {events}")
    name = "delta_trace_shed_at_reserve.json" if args.shed_at_reserve else "delta_trace.json"
    Path(args.out or REPO / "benchmarks" / "results" / name).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
