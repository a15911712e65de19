"""Section 3: adding high-bandwidth or cost-efficient devices to a pool, no knob changed."""

from __future__ import annotations

from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import change, md_table, sec, tok
from cadencerl.report.matrix import COMPOSITIONS, HETEROGENEOUS_POLICIES, pool_scenario


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
              f"![composability]({rel})\n",
              "*Figure 3. CadenceRL on each pool in the throughput (x, thousands of tokens/s) vs P95 latency "
              "(y, seconds) plane. Red arrows add high-bandwidth H800 devices, blue arrows add cost-efficient "
              "A910X or BI-V150 devices; an arrow pointing down means lower tail latency, pointing right means higher "
              "throughput.*\n"]
    return "\n".join(parts)
