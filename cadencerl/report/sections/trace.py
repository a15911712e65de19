"""Section 5: one long trajectory's KV share over its life, CadenceRL vs Laminar."""

from __future__ import annotations

from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import md_table, pct, sec, tok
from cadencerl.report.matrix import DETAIL_POOL, pool_scenario


def _trace_stats(points: list[list]) -> dict:
    """Lifetime, resident fraction, residency stints and KV share of one traced trajectory."""
    t0, t_end = points[0][0], points[-1][0]
    resident, stints, prev = 0.0, 0, None
    for (ta, acc, *_), (tb, *_rest) in zip(points, points[1:]):
        if acc is not None:
            resident += tb - ta
    for _t, acc, *_ in points:
        if acc is not None and prev is None:
            stints += 1
        prev = acc
    shares = [p[3] for p in points if p[1] is not None]
    types = [p[1] for p in points if p[1] is not None]
    moves = sum(a != b for a, b in zip(types, types[1:]))
    life = t_end - t0
    return {"admitted": t0, "done": t_end, "life": life, "resident": resident / life if life else 1.0,
            "stints": stints, "mean_share": sum(shares) / len(shares) if shares else 0.0,
            "max_share": max(shares, default=0.0), "context": points[-1][2],
            "accels": sorted(set(types)), "type_moves": moves}


def kv_share_trace(ctx: Report) -> str:
    """Section 5: one long trajectory's KV share over its life, CadenceRL vs Laminar (same seed, same workload)."""
    s = pool_scenario(DETAIL_POOL, ctx.settings)
    tid = ctx.runner.run(s, "cadence")["longest_trajectory"]
    traces, stats = {}, {}
    for p in ("cadence", "laminar"):
        traces[p] = ctx.runner.run(s, p, trace=(tid,))["traces"][str(tid)]
        stats[p] = _trace_stats(traces[p])
    path, rel = ctx.figure("kv_share")
    plots.kv_share(path, traces, {p: st["done"] for p, st in stats.items()},
                   f"Trajectory {tid} on {DETAIL_POOL}: its share of its worker's KV, CadenceRL vs Laminar")
    rows = [[p, tok(st["context"]), sec(st["admitted"]), sec(st["done"]), sec(st["life"]), pct(st["resident"]),
             st["stints"], st["type_moves"], f"{st['mean_share']:.3f}", f"{st['max_share']:.3f}",
             ", ".join(st["accels"])]
            for p, st in stats.items()]
    c, lam = stats["cadence"], stats["laminar"]
    gaps = ("Gaps in the line and grey bands mark times it was not resident on any worker"
            if min(c["resident"], lam["resident"]) < 1 else
            "It was resident throughout in both runs, so the lines have no gaps (gaps and grey bands would mark "
            "non-resident time)")
    first = "CadenceRL" if c["done"] < lam["done"] else "Laminar"
    if first != "CadenceRL":
        ctx.losses.append(f"KV-share trace on {DETAIL_POOL}: the traced trajectory {tid} finishes later under CadenceRL "
                          f"({sec(c['done'])} s) than under Laminar ({sec(lam['done'])} s).")
    if c["stints"] < 2 or c["resident"] >= 0.5:
        ctx.mismatches.append(f"KV-share trace on {DETAIL_POOL}: the paper's yield-and-return pattern does not show; "
                              f"under CadenceRL trajectory {tid} is resident {pct(c['resident'])} of its life in "
                              f"{c['stints']} stint(s), {c['type_moves']} move(s) across accelerator types.")
    return "\n".join([
        "## 5. One long trajectory's KV share over its life\n",
        "Paper (Figure 14): a roughly 16K-token trajectory under CadenceRL repeatedly yields and returns at high KV "
        "share and completes first despite being resident for less than half its life; Laminar keeps it "
        "continuously resident at a persistently low KV share.\n",
        ctx.setup_line(s), "",
        f"The traced trajectory is the longest one of the CadenceRL run (id {tid}; the same seed gives the same "
        "workload under every policy). Both runs were repeated with `simulate(scenario, policy, trace=(id,))` "
        f"(Python API; the CLI does not expose traces). The untraced runs: {ctx.command('compare', s, ['cadence', 'laminar'])}\n",
        md_table(["policy", "final context tokens", "admitted at s", "last seen at s", "life s", "resident",
                  "residency stints", "moves across types", "mean KV share resident", "max KV share",
                  "accelerators used"], rows), "",
        "A residency stint ends when the trajectory is left on no worker at a decision tick; a move that evicts and "
        "places it within the same tick keeps it resident (it shows as a change of accelerator type, or not at all "
        "between two workers of one type: the trace records types, not worker ids).\n",
        f"Measured: {first} completes this trajectory first. Under CadenceRL it is resident {pct(c['resident'])} of "
        f"its life in {c['stints']} stint(s) at a mean KV share of {c['mean_share']:.3f}; under Laminar "
        f"{pct(lam['resident'])} in {lam['stints']} stint(s) at {lam['mean_share']:.3f}. Times come from the "
        "decision ticks (every 0.5 s), so 'last seen' is within one tick of completion.\n",
        f"![kv share]({rel})\n",
        f"*Figure 5. Trajectory {tid} on {DETAIL_POOL}: its share (0-1) of its worker's used KV cache against time "
        f"since admission (seconds), CadenceRL (top) and Laminar (bottom). {gaps}; the dashed line marks the last "
        "decision tick before completion.*\n"])
