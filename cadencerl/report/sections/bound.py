"""Section 8: every run's distance from the oracle's physical bound."""

from __future__ import annotations

from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import md_table, pct, ratio, sec, tok
from cadencerl.report.matrix import HETEROGENEOUS_POLICIES, HOMOGENEOUS_POLICIES, all_pools
from cadencerl.runs import bounds


def physical_bound(ctx: Report) -> str:
    """Section 8: throughput as a fraction of the oracle bound, P95 as a multiple of it; the derivation."""
    pools = all_pools(ctx.settings)
    by_pool = {s.name: ctx.run_all(s, HOMOGENEOUS_POLICIES if s.name.startswith("h800-16") else HETEROGENEOUS_POLICIES)
               for s in pools}
    tp_rows = [[n, tok(rs["cadence"]["bound_throughput_tok_s"])] + [
        pct(rs[p]["throughput_fraction_of_bound"]) if p in rs else "-" for p in HOMOGENEOUS_POLICIES]
        for n, rs in by_pool.items()]
    lat_rows = [[n, sec(rs["cadence"]["bound_latency_p95_s"])] + [
        ratio(rs[p]["p95_multiple_of_bound"]) if p in rs else "-" for p in HOMOGENEOUS_POLICIES]
        for n, rs in by_pool.items()]
    path, rel = ctx.figure("bound")
    plots.bound_scatter(path, [r for rs in by_pool.values() for r in rs.values()])
    derivation = bounds.__doc__.split("Derivation (also in the report):", 1)[-1].strip()
    return "\n".join([
        "## 8. Distance from the physical bound\n",
        "`bound_throughput_tok_s` and `bound_latency_p95_s` come from an explicitly named oracle "
        "(`cadencerl/runs/bounds.py`) that reads the sealed target lengths; no policy can beat them on the same pool "
        "and workload. Runs and setups as in sections 1-3; `-` = not run (DORA* on heterogeneous pools).\n",
        "### Derivation\n", derivation, "",
        "### Throughput as a fraction of the bound\n",
        md_table(["pool", "bound tok/s", *HOMOGENEOUS_POLICIES], tp_rows), "",
        "### P95 latency as a multiple of the bound\n",
        md_table(["pool", "bound P95 s", *HOMOGENEOUS_POLICIES], lat_rows), "",
        f"![bound]({rel})\n",
        "*Figure 8. Every run of sections 1-3 as one point: P95 latency as a multiple of the P95 latency bound "
        "(x; 1 would be the bound) against throughput as a percentage of the throughput bound (y; 100% would be "
        "the bound). Up and to the left is better.*\n"])
