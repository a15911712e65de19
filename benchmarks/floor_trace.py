"""Where does a CadenceRL run at batch 1,024 lose to the least-loaded floor? (issue 12)

Usage: python benchmarks/floor_trace.py [--pool 16b8h] [--seed 5]
           [--policies benchmarks/variants/cadence-any-shed-drain.yaml,cadence,least-loaded] [--every 10] [--out PATH]

Runs `benchmarks/scenarios/POOL-b1024.yaml` with each policy and prints, over the steady window
(first and last iterations left out, as `least_loaded_floor.py` judges them):

* steady throughput and P95 (from admission), and the whole run's evictions;
* per accelerator type, from a snapshot of the pool every `--every` simulated seconds: the mean
  residents and KV use of a worker, how many versions it runs behind the trainer, and the share of
  snapshots in which it is "pinned": one or two residents of an older version and nothing else, so
  it can neither advance nor take the newer version's fresh work;
* for CadenceRL: the first shed of each version, when it came, and whether the version was then
  pacing or concentrating (its budget spent and a higher-affinity worker to send its tail to);
* the trajectories at or above the steady P95: their decode rate while resident (tokens per
  resident second), their non-resident share and migrations.

The tracing wrapper reads the view the policy is given and passes every action through unchanged.
What the figures showed for 16b8h seed 5: README, and docs/policies/cadence.md on `drain.bind_while_pacing`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from least_loaded_floor import b1024_scenario  # noqa: E402  (the same runs the floor benchmark judges)

from cadencerl.policies.cadence import Cadence  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402
from cadencerl.runs.steady import steady_view  # noqa: E402

# every shed lets a version drain (the default before drain.bind_while_pacing), the default, the floor
POLICIES = "benchmarks/variants/cadence-any-shed-drain.yaml,cadence,least-loaded"


class Traced:
    """A policy whose views are sampled every `every_s` and whose first shed per version is noted."""

    def __init__(self, policy, every_s: float) -> None:
        self.policy, self.every_s = policy, every_s
        self.snapshots: list[tuple[float, int, list[tuple[str, int, int, float]]]] = []
        self.first_shed: dict[int, tuple[float, str]] = {}
        self._last = -float("inf")

    def __getattr__(self, name: str):
        return getattr(self.policy, name)   # name, kv_transfer, kv_staging, gate, ...: the policy's own

    def decide(self, view):
        if view.now - self._last >= self.every_s:
            self._last = view.now
            self.snapshots.append((view.now, view.trainer_version, [
                (w.accelerator, w.version, len(w.residents), w.kv_used / w.kv_capacity) for w in view.alive()]))
        bound = set(getattr(self.policy, "kv_bound", ()))
        yield from self.policy.decide(view)
        for v in set(getattr(self.policy, "kv_bound", ())) - bound:
            self.first_shed[v] = (view.now, "pacing" if v in self.policy.paced_bound else "concentrating")


def by_type(snapshots, window: tuple[float, float]) -> dict[str, dict[str, float]]:
    """Per accelerator type: mean residents, KV use and versions behind, and the pinned share."""
    rows: dict[str, list[tuple[int, float, int, bool]]] = defaultdict(list)
    for now, trainer, workers in snapshots:
        if not window[0] <= now <= window[1]:
            continue
        for acc, version, load, kv in workers:
            rows[acc].append((load, kv, trainer - version, 0 < load <= 2 and version < trainer))
    return {acc: {"residents": float(np.mean([r[0] for r in rs])), "kv_use": float(np.mean([r[1] for r in rs])),
                  "versions_behind": float(np.mean([r[2] for r in rs])), "pinned": float(np.mean([r[3] for r in rs]))}
            for acc, rs in sorted(rows.items())}


def tail_figures(trajectories, window: tuple[float, float], p95: float) -> dict[str, float]:
    """The steady window's trajectories at or above its P95 (from admission)."""
    tail = [t for t in trajectories if window[0] <= t.completed_at <= window[1] and t.completed_at - t.admitted_at >= p95]
    lat = np.array([t.completed_at - t.admitted_at for t in tail])
    resident = np.array([max(t.resident_time, 1e-9) for t in tail])
    return {"trajectories": len(tail), "tokens": float(np.mean([t.tokens for t in tail])),
            "decode_tok_s_while_resident": float(np.mean([t.tokens for t in tail] / resident)),
            "non_resident_share": float(np.mean(1 - resident / lat)),
            "migrations": float(np.mean([t.migrations for t in tail]))}


def run(pool: str, seed: int, name: str, every_s: float) -> dict:
    scenario = b1024_scenario(pool, seed)
    traced = Traced(make_policy(str(REPO / name) if name.endswith(".yaml") else name, scenario), every_s)
    keep: dict = {}
    result = steady_view(simulate(scenario, traced, keep=keep))
    window = tuple(result["steady_window_s"])
    return {"policy": name, "throughput_tok_s": result["throughput_tok_s"], "latency_p95_s": result["latency_p95_s"],
            "evictions": result["evictions"], "by_type": by_type(traced.snapshots, window),
            "first_shed": {str(v): list(x) for v, x in sorted(traced.first_shed.items())}
            if isinstance(traced.policy, Cadence) else None,
            "tail": tail_figures(keep["controller"].trajectories.values(), window, result["latency_p95_s"])}


def show(r: dict) -> None:
    print(f"{r['policy']}: {r['throughput_tok_s']:,.0f} tok/s, P95 {r['latency_p95_s']:.1f} s (steady window), "
          f"{r['evictions']} evictions (whole run)")
    for acc, f in r["by_type"].items():
        print(f"  {acc:8s} residents {f['residents']:6.1f}  KV {f['kv_use']:.2f}  "
              f"versions behind {f['versions_behind']:.2f}  pinned {f['pinned']:.0%}")
    if r["first_shed"] is not None:
        sheds = ", ".join(f"v{v} {t:.0f}s {phase}" for v, (t, phase) in r["first_shed"].items())
        print(f"  first shed per version: {sheds or 'none'}")
    t = r["tail"]
    print(f"  tail (>= P95, {t['trajectories']}): {t['tokens']:,.0f} tokens, {t['decode_tok_s_while_resident']:.1f} "
          f"tok/s while resident, non-resident {t['non_resident_share']:.1%}, migrations {t['migrations']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="16b8h")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--every", type=float, default=10.0, help="simulated seconds between snapshots")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = [run(args.pool, args.seed, name, args.every) for name in args.policies.split(",")]
    for r in runs:
        show(r)
    if args.out is not None:
        args.out.write_text(json.dumps({"pool": args.pool, "seed": args.seed, "runs": runs}, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
