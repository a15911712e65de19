"""Section 7: how much of its life a trajectory spends on no worker, per pool."""

from __future__ import annotations

from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import md_table, pct
from cadencerl.report.matrix import PAPER_NON_RESIDENT_P95, all_pools


def non_resident(ctx: Report) -> str:
    """Section 7: P50/P95 of the fraction of each trajectory's life spent off every worker, CadenceRL, per pool."""
    pools = all_pools(ctx.settings)
    runs = [ctx.runner.run(s, "cadence") for s in pools]
    rows = [[s.name, s.model, pct(r["non_resident_p50"]), pct(r["non_resident_p95"]),
             pct(PAPER_NON_RESIDENT_P95[s.name]) if s.name in PAPER_NON_RESIDENT_P95 else "",
             f"{r['evictions']} ({pct(r['evictions'] / r['trajectories_completed'])})",
             ctx.command("sim", s, "cadence")] for s, r in zip(pools, runs)]
    by = {s.name: r for s, r in zip(pools, runs)}
    order = "lower" if by["32a"]["non_resident_p95"] < by["32b"]["non_resident_p95"] else "not lower"
    if order != "lower":
        ctx.mismatches.append(f"non-resident time: the 32a P95 is not lower than 32b's "
                              f"({pct(by['32a']['non_resident_p95'])} vs {pct(by['32b']['non_resident_p95'])}).")
    far = [s.name for s in pools if s.name in PAPER_NON_RESIDENT_P95 and
           abs(by[s.name]["non_resident_p95"] - PAPER_NON_RESIDENT_P95[s.name]) > 0.15]
    if far:
        ctx.mismatches.append(f"non-resident time: the P95 differs from the paper's by more than 15 points on "
                              f"{', '.join(far)} (see section 7).")
    return "\n".join([
        "## 7. Non-resident time (CadenceRL)\n",
        "The fraction of a trajectory's life (admission to completion) during which it was on no worker: waiting "
        "in the pending set after a pacing or concentration eviction, or before its first placement. Time spent "
        "queued or preempted inside a worker's engine counts as resident (the trajectory is assigned there). Paper "
        "(Table 3, 2nd-hand via shared/reference/hardware.md): P95 of 39.9% on 32A, 80.9% on 32B, 40.3% on "
        "16A16B8H; 32A lower than 32B at every percentile. Each pool's setup is listed in sections 1-3 (eta "
        f"{pools[0].controller.eta}, delta {pools[0].cadence.delta}, seed {pools[0].seed}).\n",
        md_table(["pool", "model", "non-resident P50", "non-resident P95", "paper P95 (2nd-hand)",
                  "evictions (per trajectory)", "reproduce"], rows),
        "",
        f"Measured: the 32a P95 non-resident fraction is {order} than 32b's "
        f"({pct(by['32a']['non_resident_p95'])} vs {pct(by['32b']['non_resident_p95'])}).\n",
        _figure_or_why(ctx, pools, runs)])


def _figure_or_why(ctx: Report, pools: list, runs: list[dict]) -> str:
    """The per-pool figure, or, when every P95 is 0 (an empty plot), what the eviction counts say instead."""
    if any(r["non_resident_p95"] > 0 for r in runs):
        path, rel = ctx.figure("non_resident")
        plots.non_resident(path, [s.name for s in pools], [r["non_resident_p50"] for r in runs],
                           [r["non_resident_p95"] for r in runs], "CadenceRL: time off every worker, per pool")
        return (f"![non-resident]({rel})\n\n*Figure 7. CadenceRL: median (P50) and 95th percentile (P95) over "
                "trajectories of the share of each trajectory's life spent not resident on any worker (percent), per "
                "pool; the P95 value is printed above each pair.*\n")
    evictions = sum(r["evictions"] for r in runs)
    said = ("Every P50 and P95 is 0, so there is no figure: in every pool's steady window at least 95% of the "
            "trajectories spent no time off every worker. ")
    if not evictions:
        return said + "CadenceRL evicted no trajectory on any pool here.\n"
    pool, rate = max(((s.name, r["evictions"] / max(r["trajectories_completed"], 1)) for s, r in zip(pools, runs)),
                     key=lambda pr: pr[1])
    return (said + f"CadenceRL made {evictions:,} evictions over these runs (whole runs; at most {rate:.3f} per "
            f"completed trajectory, on {pool}). The paper's large non-resident fractions do not appear in this "
            "simulation.\n")
