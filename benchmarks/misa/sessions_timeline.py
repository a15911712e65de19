"""Sessions a worker holds over a run, and its engine queue, under admission policies (issue 13).

A static cap (`cap<N>+...`) holds a fixed number of sessions; MISA-T's caps adapt. Past the
sessions that fill an engine's running batch the engine queues, and a queued turn's cached
prefix, released longest ago, is the first the LRU evicts: that is the cliff between
`cap2048` and `cap3072` on mixed-h200-235b rollout-only. This samples, from the controller's
view (what a router sees), the mean per worker of the admitted sessions, the requests at the
engine (running or queued), the engine's queue and its KV use, and plots them over time.

Usage: python benchmarks/misa/sessions_timeline.py -s mixed-h200-235b --trajectories 51200 \\
           --batch-size 2048 --eta 1000 --trainer-cluster h200 \\
           --policies misa+cache-aware-tuned,cap2048+cache-aware-tuned,cap3072+cache-aware-tuned
       [--every 25] [--version-switch when-idle] [--jobs 2]
       [--out PNG, default benchmarks/results/sessions_timeline_<scenario>.png]

Set CADENCERL_CACHE_DIR to the folder a `compare` of the same scenario used, and the router's
thresholds come from its sweep instead of a new one.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
if __name__ == "__main__":   # it samples each decision by replacing the policy's `decide`, which a compiled
    os.environ["CADENCERL_PURE_PYTHON"] = "1"   # policy (`make native`) does not allow: plain Python, here and in its workers

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cadencerl.cli.common import scenario_from_options as scenario_of  # noqa: E402
from cadencerl.config import ConfigError  # noqa: E402
from cadencerl.report.plots import policy_color  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402

SERIES = ("sessions", "at_engine", "queued", "kv_use")


def run_one(args: argparse.Namespace, name: str) -> dict:
    """Simulate one policy, sampling the pool's per-worker means every `args.every` sim seconds."""
    scenario = scenario_of(args)
    policy = make_policy(name, scenario, version_switch=args.version_switch)
    samples: dict[str, list[float]] = {"t": [], **{k: [] for k in SERIES}}
    decide, due = policy.decide, [0.0]

    def sampled(view):
        if view.now >= due[0]:
            due[0] = view.now + args.every
            ws = view.alive()
            n = max(1, len(ws))
            samples["t"].append(view.now)
            samples["sessions"].append(sum(w.sessions for w in ws) / n)
            samples["at_engine"].append(sum(w.load for w in ws) / n)
            samples["queued"].append(sum(w.num_waiting for w in ws) / n)
            samples["kv_use"].append(sum(w.engine_kv / w.kv_capacity for w in ws) / n)
        yield from decide(view)

    policy.decide = sampled
    r = simulate(scenario, policy)
    seqs = scenario.pool[0].max_num_seqs
    return {"policy": name, "throughput": r["throughput_tok_s"], "steady": r.get("steady_throughput_tok_s") or None,
            "hits": r["prefix_hit_rate"], "window": r.get("steady_window_s"), "max_num_seqs": seqs, **samples}


def steady(run: dict, key: str) -> np.ndarray:
    """The samples in the steady window; all of them on a run too short to have one."""
    t, x = np.asarray(run["t"]), np.asarray(run[key])
    if not run["window"]:
        return x
    lo, hi = run["window"]
    return x[(t >= lo) & (t <= hi)]


def table(runs: list[dict]) -> Table:
    out = Table(title="per worker, over the steady window (mean; 5th-95th percentile of the samples)")
    for col in ("policy", "tok/s (steady)", "prefix hits", "sessions", "at engine", "queued", "engine KV use"):
        out.add_column(col, justify="left" if col == "policy" else "right")
    for r in runs:
        cells = []
        for key, fmt in (("sessions", ".0f"), ("at_engine", ".0f"), ("queued", ".1f"), ("kv_use", ".2f")):
            x = steady(r, key)
            cells.append("-" if x.size == 0 else
                         f"{x.mean():{fmt}} ({np.percentile(x, 5):{fmt}}-{np.percentile(x, 95):{fmt}})")
        steady_tok = "-" if r["steady"] is None else f"{r['steady']:,.0f}"
        out.add_row(r["policy"], f"{r['throughput']:,.0f} ({steady_tok})", f"{100 * r['hits']:.1f}%", *cells)
    return out


def plot(runs: list[dict], title: str, out: Path) -> None:
    """Four panels over simulated time, one line per policy in the report's colours; the steady window
    the table summarises is shaded, and the engine's max_num_seqs is drawn only where it is in scale."""
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    labels = ("admitted sessions\nper worker", "requests at the engine\nper worker (running + queued)",
              "engine queue\nper worker", "engine KV use\n(fraction of capacity)")
    for ax, key, label in zip(axes, SERIES, labels):
        for i, r in enumerate(runs):
            ax.plot(r["t"], r[key], label=r["policy"], linewidth=1, color=policy_color(r["policy"], i))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for i, window in enumerate(dict.fromkeys(tuple(r["window"]) for r in runs if r["window"])):
            ax.axvspan(*window, color="grey", alpha=0.08, lw=0, label=None if i else "steady window")
    seqs = runs[0]["max_num_seqs"]
    for ax, key in zip(axes[:2], SERIES[:2]):
        if seqs <= 2 * max(max(r[key], default=0) for r in runs):
            ax.axhline(seqs, color="grey", linestyle="--", linewidth=1, label="engine max_num_seqs")
    axes[-1].set_ylim(0, 1.05)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}   # every panel's, once
    axes[0].legend(handles.values(), handles.keys(), fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.02), ncol=4)
    axes[-1].set_xlabel("simulated time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("-s", "--scenario")
    src.add_argument("-c", "--config")
    ap.add_argument("--trajectories", type=int)
    ap.add_argument("--seed", type=int, help="workload seed (default: the scenario's)")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--eta", type=int)
    ap.add_argument("--trainer-cluster")
    ap.add_argument("--policies", required=True, help="comma-separated policy names, as `compare` takes them")
    ap.add_argument("--version-switch", default="when-idle", help="how the tuned router's workers take new weights (default when-idle)")
    ap.add_argument("--every", type=float, default=25.0, help="sim seconds between samples")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.every <= 0:
        ap.error("--every: must be positive")
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        scenario = scenario_of(args)
        for name in names:
            make_policy(name, scenario, version_switch=args.version_switch)   # bad names fail here, not in a worker
    except ConfigError as exc:
        ap.error(str(exc))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = list(pool.map(run_one, [args] * len(names), names))
    Console(width=160).print(table(runs))
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"sessions_timeline_{scenario.name}.png"
    plot(runs, f"{scenario.name}: sessions, engine load, queue and KV use per worker", out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
