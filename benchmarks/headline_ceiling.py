"""How far can any policy go on 16a16b8h in steady state, and why not 1.48x / 0.5x (issue 12).

Usage: python benchmarks/headline_ceiling.py [--scenario benchmarks/scenarios/16a16b8h-steady.yaml]
           [--trajectories N] [--baselines ...] [--ablations ...] [--no-reference] [--jobs J]
           [--out benchmarks/results/headline_ceiling.json]

Runs the baselines (with group routing: their best honest setting), CadenceRL, its ablations and
the clairvoyant longest-first reference (`runs/reference.py`) on one scenario, and prints, over the
steady window (`runs/steady.py`: first and last iteration left out):

1. throughput and P95 (from admission and from submission) of each, the ratio to the best baseline's
   throughput and to the best asynchronous baseline's P95, and the physical bound (`runs/bounds.py`);
2. the tail: for the trajectories at or above P95, the mean time queued before admission, resident
   decoding at the observed batch, resident otherwise (prefill, KV preparation, engine queue,
   preemption recompute) and non-resident after admission (`runs/tail.py`);
3. the floor: decoding a 16,384-token trajectory at the batch each accelerator type runs (CadenceRL's
   observed batch and the best async baseline's), and alone (batch 1).

`--trajectories N` resizes the scenario with the batch scaled alike (same number of iterations),
for a quick check; the figures quoted in benchmarks/README.md are from the full scenario.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cadencerl.config import Scenario, load_scenario_file  # noqa: E402
from cadencerl.runs.assemble import build_pool  # noqa: E402
from cadencerl.runs.reference import REFERENCE, clairvoyant_reference  # noqa: E402
from cadencerl.runs.registry import grouped_label, make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402
from cadencerl.runs.steady import steady_view, steady_window  # noqa: E402
from cadencerl.runs.tail import (  # noqa: E402
    batch_within,
    best_split,
    decode_seconds,
    observed_batch,
    tail_breakdown,
)

DEFAULT_SCENARIO = REPO / "benchmarks" / "scenarios" / "16a16b8h-steady.yaml"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "headline_ceiling.json"
BASELINES = "sync-grouped,one-off-grouped,laminar-grouped,areal-grouped,least-loaded-grouped"
ASYNC = ("laminar", "areal")         # the asynchronous baselines the paper's latency goal names
ABLATIONS = "cadence-no-pacing,cadence-no-concentration,cadence-no-affinity,cadence-no-kv-prep"
LONG = 16384                         # the workload's response cap: the longest trajectory
KEEP = ("policy", "throughput_tok_s", "latency_p50_s", "latency_p95_s", "latency_from_submit_p95_s",
        "run_throughput_tok_s", "run_latency_p95_s", "non_resident_p95", "preemptions", "evictions",
        "migrations", "prefix_hit_rate", "prefill_tokens", "steady_window_s", "steady_iterations",
        "steady_trajectories", "bound_throughput_tok_s", "bound_makespan_by", "bound_latency_p95_s",
        "sim_time_s", "wall_time_s")


def run_one(scenario: Scenario, name: str) -> dict:
    """One policy's steady figures, its tail split and the batch its workers ran."""
    keep: dict = {}
    started = time.perf_counter()
    if name == REFERENCE:
        result = clairvoyant_reference(scenario)
    else:
        base, grouped = grouped_label(name)
        result = simulate(scenario, make_policy(base, scenario, grouped=grouped), keep=keep)
    out = {k: v for k, v in steady_view(result).items() if k in KEEP}
    out["wall_time_s"] = time.perf_counter() - started
    ctl = keep.get("controller")
    if ctl is None:
        return out
    workers, perfs = build_pool(scenario)
    publish = ctl.trainer.publish_times
    window = steady_window(publish, -(-len(ctl.trajectories) // scenario.trainer.batch_size))
    batch = observed_batch(ctl.counters.samples, ctl.workers, window)
    perf_of = {w.accelerator: p for w, p in zip(workers, perfs)}
    for acc, b in batch.items():
        b["step_s"] = decode_seconds(perf_of[acc], 1, b["decode_batch"], b["mean_context"])
    step = {acc: b["step_s"] for acc, b in batch.items()}
    done = [t for t in ctl.trajectories.values() if t.completed_at >= 0]
    order = {tid: i for i, tid in enumerate(ctl.trajectories)}
    args = (done, order, scenario.trainer.batch_size, scenario.controller.eta, publish, step, ctl.workers)
    out["observed_batch"] = batch
    out["tail_from_admission"] = tail_breakdown(*args)
    out["tail_from_submission"] = tail_breakdown(*args, from_submit=True)
    return out


def floors(scenario: Scenario, batches: dict[str, dict]) -> dict:
    """Seconds to decode a LONG-token trajectory on each type: alone, and at each run's observed batch."""
    workers, perfs = build_pool(scenario)
    out: dict[str, dict] = {}
    for w, p in zip(workers, perfs):
        if w.accelerator in out:
            continue
        prompt = scenario.workload.prompt.median
        row = {"alone_s": p.decode_line(1, int(prompt) + 1).time(LONG - 1)}
        for policy, batch in batches.items():
            b = batch.get(w.accelerator)
            if b:
                row[policy] = decode_seconds(p, LONG, b["decode_batch"], b["mean_context"])
        out[w.accelerator] = row
    return out


def halving(scenario: Scenario, target_s: float, tail: dict, observed: dict[str, dict]) -> dict:
    """What a P95 of `target_s` asks of the pool: the trajectory at the P95 length must decode within
    it, so the batch it runs in is capped; per type, that cap (a batch of tail work: context prompt +
    half that length) and a worker's tok/s there against its tok/s at `observed` (CadenceRL's)."""
    workers, perfs = build_pool(scenario)
    length = int(tail["length_at_percentile"])
    context = scenario.workload.prompt.median + length / 2
    out: dict = {"target_s": target_s, "length": length, "token_share": tail["token_share_at_or_above_it"], "types": {}}
    for w, p in zip(workers, perfs):
        row = out["types"].setdefault(w.accelerator, {"workers": 0})
        row["workers"] += 1
        cap = batch_within(p, length, target_s, context, w.max_num_seqs)
        row["batch_cap"] = cap
        row["worker_tok_s_at_cap"] = cap / p.decode_step_time(cap, int(cap * context)) if cap else 0.0
        b = observed.get(w.accelerator)
        row["worker_tok_s_observed"] = b["decode_batch"] / b["step_s"] if b else 0.0
    out["pool_tok_s_at_caps"] = sum(r["workers"] * r["worker_tok_s_at_cap"] for r in out["types"].values())
    out["best_split_tok_s"] = best_split(out["types"], out["token_share"])
    return out


def ratios(rows: dict[str, dict], baselines: list[str]) -> tuple[str, str]:
    """Add each row's ratios; return the best baseline (throughput) and best async baseline (P95)."""
    best = max(baselines, key=lambda n: rows[n]["throughput_tok_s"])
    asyncs = [n for n in baselines if n.split("-")[0] in ASYNC] or baselines
    best_async = min(asyncs, key=lambda n: rows[n]["latency_p95_s"])
    for r in rows.values():
        r["throughput_vs_best"] = r["throughput_tok_s"] / rows[best]["throughput_tok_s"]
        r["p95_vs_best_async"] = r["latency_p95_s"] / rows[best_async]["latency_p95_s"]
        r["p95_submit_vs_best_async"] = r["latency_from_submit_p95_s"] / rows[best_async]["latency_from_submit_p95_s"]
    return best, best_async


def print_report(data: dict) -> None:
    rows, best, best_async = data["runs"], data["best_baseline"], data["best_async_baseline"]
    bound = next(iter(rows.values()))
    print(f"\n{data['scenario']}: {data['trajectories']:,} trajectories, batch {data['batch_size']:,}; "
          f"steady window {rows[best]['steady_window_s'][0]:.0f}-{rows[best]['steady_window_s'][1]:.0f} s "
          f"({rows[best]['steady_iterations']} iterations)")
    print(f"best baseline (throughput): {best}; best async baseline (P95): {best_async}\n")
    print(f"{'policy':28} {'tok/s':>8} {'x best':>7} {'P95 adm s':>9} {'x async':>7} {'P95 sub s':>9} {'x async':>7} {'evict':>6} {'preempt':>7}")
    for name, r in rows.items():
        print(f"{name:28} {r['throughput_tok_s']:8,.0f} {r['throughput_vs_best']:7.3f} {r['latency_p95_s']:9.0f} "
              f"{r['p95_vs_best_async']:7.3f} {r['latency_from_submit_p95_s']:9.0f} {r['p95_submit_vs_best_async']:7.3f} "
              f"{r.get('evictions', 0):6} {r.get('preemptions', 0):7}")
    tb, lb = bound["bound_throughput_tok_s"], bound["bound_latency_p95_s"]
    print(f"{'physical bound':28} {tb:8,.0f} {tb / rows[best]['throughput_tok_s']:7.3f} {lb:9.0f} "
          f"{lb / rows[best_async]['latency_p95_s']:7.3f}   (makespan bound by {bound['bound_makespan_by']}; whole run)")
    print("\nP95 tail (steady window, trajectories at/above P95): mean seconds")
    print(f"{'policy':28} {'from':>5} {'cut':>6} {'latency':>7} {'tokens':>7} {'queued':>6} {'decode':>6} {'res.other':>9} {'non-res':>7}")
    for name, r in rows.items():
        for label, key in (("adm", "tail_from_admission"), ("sub", "tail_from_submission")):
            t = r.get(key)
            if t and t.get("trajectories"):
                print(f"{name:28} {label:>5} {t['cut_s']:6.0f} {t['latency_s']:7.0f} {t['tokens']:7.0f} "
                      f"{t['queued_before_admission_s']:6.0f} {t['resident_decode_s']:6.0f} "
                      f"{t['resident_other_s']:9.0f} {t['non_resident_s']:7.0f}")
    print(f"\nFloor: seconds to decode a {LONG:,}-token trajectory (prompt = median), alone and at the observed batch")
    for acc, row in data["floors"].items():
        batch = "  ".join(f"{p} {s:.0f} s (batch {rows[p]['observed_batch'][acc]['decode_batch']:.0f})"
                          for p, s in row.items() if p != "alone_s")
        print(f"  {acc:8} alone {row['alone_s']:.0f} s;  {batch}")
    print("\nObserved batch over the steady window (busy workers): residents / batch a full KV cache holds at their context / busy share")
    for name in ("cadence", best, best_async):
        cells = "  ".join(f"{a} {b['residents']:.0f}/{b['kv_full_batch']:.0f}/{b['busy']:.0%}"
                          for a, b in rows[name]["observed_batch"].items())
        print(f"  {name:28} {cells}")
    h = data["halving"]
    print(f"\nA P95 of {h['target_s']:.0f} s (0.5x {best_async}): the P95-length trajectory ({h['length']:,} tokens; "
          f"trajectories this long or longer hold {h['token_share']:.0%} of all tokens) must decode within it:")
    for acc, r in h["types"].items():
        print(f"  {acc:8} batch <= {r['batch_cap']:3}: {r['worker_tok_s_at_cap']:6,.0f} tok/s a worker "
              f"(CadenceRL's observed batch: {r['worker_tok_s_observed']:6,.0f}) x {r['workers']}")
    print(f"  pool with every worker at that cap: {h['pool_tok_s_at_caps']:,.0f} tok/s; best clairvoyant split "
          f"(tail at the caps, the rest at CadenceRL's rates): {h['best_split_tok_s']:,.0f} tok/s "
          f"= {h['best_split_tok_s'] / rows[best]['throughput_tok_s']:.3f}x {best} (1.48x is {1.48 * rows[best]['throughput_tok_s']:,.0f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(DEFAULT_SCENARIO))
    ap.add_argument("--trajectories", type=int, default=None)
    ap.add_argument("--baselines", default=BASELINES)
    ap.add_argument("--ablations", default=ABLATIONS)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    scenario = load_scenario_file(args.scenario)
    if args.trajectories:
        scenario = scenario.resized(args.trajectories)
    baselines = [n for n in args.baselines.split(",") if n]
    # the reference first: it is the slowest run, so the pool's jobs finish together
    names = ([] if args.no_reference else [REFERENCE]) + ["cadence"] + baselines
    names += [n for n in args.ablations.split(",") if n]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {n: pool.submit(run_one, scenario, n) for n in names}
        shown = baselines + ["cadence"] + [n for n in names if n not in baselines + ["cadence", REFERENCE]]
        rows = {n: futures[n].result() for n in shown + [n for n in names if n == REFERENCE]}
    best, best_async = ratios(rows, baselines)
    data = {"scenario": scenario.name, "trajectories": scenario.workload.trajectories,
            "batch_size": scenario.trainer.batch_size, "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
            "best_baseline": best, "best_async_baseline": best_async, "runs": rows,
            "floors": floors(scenario, {n: rows[n]["observed_batch"] for n in ("cadence", best_async)}),
            "halving": halving(scenario, 0.5 * rows[best_async]["latency_p95_s"], rows["cadence"]["tail_from_admission"],
                               rows["cadence"]["observed_batch"])}
    Path(args.out).write_text(json.dumps(data, indent=1))
    print_report(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
