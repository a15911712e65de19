"""Section 3: adding high-bandwidth or cost-efficient devices to a pool, no knob changed."""

from __future__ import annotations

from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import change, md_table, sec, tok
from cadencerl.report.matrix import COMPOSITIONS, HETEROGENEOUS_POLICIES, pool_scenario
from cadencerl.runs.plan import pool_cost
from cadencerl.runs.prices import catalog_prices


def composability(ctx: Report) -> str:
    """Section 3: adding high-bandwidth (H800) vs cost-efficient (A910X, BI-V150) devices, no knob changed."""
    parts = ["## 3. Composability: adding devices without touching any routing setting\n",
             "Paper claim: adding high-bandwidth accelerators (H800) reduces tail latency; adding cost-efficient ones "
             "(A910X, BI-V150) increases throughput. Each row extends a pool with devices of one kind and reruns with "
             "the same workload, eta, delta and affinity order. The starting pools 16a, 16b and 8h are not built-ins; "
             "their scenario files are in `scenarios/`.\n"]
    names = dict.fromkeys([n for move in COMPOSITIONS for n in move[:2]])
    results = {n: ctx.run_all(pool_scenario(n, ctx.settings), HETEROGENEOUS_POLICIES) for n in names}
    rows, per_policy = [], []
    for src, dst, kind in COMPOSITIONS:
        a, b = results[src]["cadence"], results[dst]["cadence"]
        metric_ok = (b["latency_p95_s"] < a["latency_p95_s"]) if kind == "high-bandwidth" else \
            (b["throughput_tok_s"] > a["throughput_tok_s"])
        if not metric_ok:
            ctx.mismatches.append(f"composability {src} -> {dst}: adding {kind} devices did not "
                              f"{'lower P95' if kind == 'high-bandwidth' else 'raise throughput'} for CadenceRL.")
        rows.append([f"{src} -> {dst}", kind, f"{tok(a['throughput_tok_s'])} -> {tok(b['throughput_tok_s'])} "
                     f"({change(b['throughput_tok_s'], a['throughput_tok_s'])})",
                     f"{sec(a['latency_p95_s'])} -> {sec(b['latency_p95_s'])} "
                     f"({change(b['latency_p95_s'], a['latency_p95_s'])})", "yes" if metric_ok else "**no**"])
        per_policy.append([f"{src} -> {dst}", kind] + [
            f"{change(results[dst][p]['throughput_tok_s'], results[src][p]['throughput_tok_s'])} / "
            f"{change(results[dst][p]['latency_p95_s'], results[src][p]['latency_p95_s'])}"
            for p in HETEROGENEOUS_POLICIES])
    path, rel = ctx.figure("composability")
    plots.composability(path, {n: (r["cadence"]["throughput_tok_s"], r["cadence"]["latency_p95_s"])
                               for n, r in results.items()}, list(COMPOSITIONS),
                        "CadenceRL as a pool is extended: each arrow adds devices of one kind")
    setups = "\n".join(f"- {n}: {ctx.setup_line(pool_scenario(n, ctx.settings))} "
                       f"Reproduce: {ctx.command('compare', pool_scenario(n, ctx.settings), HETEROGENEOUS_POLICIES)}"
                       for n in names)
    parts += [setups, "", "### CadenceRL\n",
              md_table(["extension", "added devices", "throughput tok/s", "P95 s", "expected direction seen?"], rows),
              "\nExpected direction: lower P95 when high-bandwidth devices are added, higher throughput when "
              "cost-efficient ones are added. More devices of any kind usually help both; the column checks the "
              "claimed axis only.\n",
              "### Every policy: throughput change / P95 change\n",
              md_table(["extension", "added devices", *HETEROGENEOUS_POLICIES], per_policy), "",
              "### What each extension costs, CadenceRL against the best baseline (the planner's prices)\n",
              costs_table(ctx, results),
              "\nThe best baseline is the one with the highest throughput on the extended pool. Prices are the "
              "catalog's, each with its source (`cadencerl plan` prints them); `cadencerl plan` searches every "
              "composition within a budget instead of these fixed steps (docs/planner.md).\n",
              f"![composability]({rel})\n",
              "*Figure 3. CadenceRL on each pool in the throughput (x, thousands of tokens/s) vs P95 latency "
              "(y, seconds) plane. Red arrows add high-bandwidth H800 devices, blue arrows add cost-efficient "
              "A910X or BI-V150 devices; an arrow pointing down means lower tail latency, pointing right means higher "
              "throughput.*\n"]
    return "\n".join(parts)


def costs_table(ctx: Report, results: dict) -> str:
    """Per extension: $/h, and throughput / P95 / tokens per dollar under CadenceRL and the best baseline."""
    prices = catalog_prices()
    baselines = [p for p in HETEROGENEOUS_POLICIES if p != "cadence"]
    rows = []
    for src, dst, kind in COMPOSITIONS:
        cost = {n: pool_cost(pool_scenario(n, ctx.settings), prices) for n in (src, dst)}
        best = max(baselines, key=lambda p: results[dst][p]["throughput_tok_s"])
        row = [f"{src} -> {dst}", kind, f"${cost[src]:,.2f} -> ${cost[dst]:,.2f}"]
        for p in ("cadence", best):
            a, b = results[src][p], results[dst][p]
            per = {n: r["throughput_tok_s"] * 3600 / cost[n] for n, r in ((src, a), (dst, b))}
            row.append(f"{change(b['throughput_tok_s'], a['throughput_tok_s'])} / "
                       f"{change(b['latency_p95_s'], a['latency_p95_s'])} / "
                       f"{per[src] / 1e3:,.0f}k -> {per[dst] / 1e3:,.0f}k")
        row.append(best)
        rows.append(row)
    return md_table(["extension", "added devices", "$/h", "CadenceRL: tok/s / P95 / tokens per $",
                     "best baseline: tok/s / P95 / tokens per $", "best baseline"], rows)
