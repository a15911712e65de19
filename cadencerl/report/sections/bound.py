"""Section 8: every run's distance from the oracle's physical bound and from the clairvoyant reference."""

from __future__ import annotations

from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import md_table, pct, ratio, sec, tok
from cadencerl.report.matrix import HETEROGENEOUS_POLICIES, HOMOGENEOUS_POLICIES, all_pools, reference_pools
from cadencerl.runs import bounds
from cadencerl.runs.reference import REFERENCE, distance


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
    ref_rows = _reference_rows(ctx, reference_pools(ctx.settings), by_pool)
    path, rel = ctx.figure("bound")
    plots.bound_scatter(path, [r for rs in by_pool.values() for r in rs.values()],
                        "Every run against the oracle's physical bound")
    derivation = bounds.DERIVATION.strip()
    return "\n".join([
        "## 8. Distance from the physical bound and from the clairvoyant reference\n",
        "`bound_throughput_tok_s` and `bound_latency_p95_s` come from an explicitly named oracle "
        "(`cadencerl/runs/bounds.py`) that reads the sealed target lengths; no policy can beat them on the same pool "
        "and workload. Runs and setups as in sections 1-3; `-` = not run (DORA* on heterogeneous pools).\n",
        "### Derivation\n", derivation, "",
        "### Throughput as a fraction of the bound\n",
        md_table(["pool", "bound tok/s", *HOMOGENEOUS_POLICIES], tp_rows), "",
        "### P95 latency as a multiple of the bound\n",
        md_table(["pool", "bound P95 s", *HOMOGENEOUS_POLICIES], lat_rows), "",
        "### Throughput as a fraction of the clairvoyant reference\n",
        "The clairvoyant reference (`cadencerl/runs/reference.py`, `policies/oracle.py`) is a scheduler that sees "
        "every trajectory's length: longest first, each on the worker where it would finish soonest, KV packed to "
        "its peak. It shows what a scheduler could do on the pool, not an optimum: a policy can beat it (over "
        "100%). Whole-run throughput, one reference run per pool (--quick: on the detail pool alone; its command: "
        "`cadencerl compare ... --reference`).\n",
        md_table(["pool", "reference tok/s", "reference P95 s", *HOMOGENEOUS_POLICIES], ref_rows), "",
        f"![bound]({rel})\n",
        "*Figure 8. Every run of sections 1-3 as one point: P95 latency as a multiple of the P95 latency bound "
        "(x; 1 would be the bound) against throughput as a percentage of the throughput bound (y; 100% would be "
        "the bound). Up and to the left is better.*\n"])


def _reference_rows(ctx: Report, pools, by_pool: dict[str, dict[str, dict]]) -> list[list]:
    """Per pool: the reference's whole-run figures, then each policy's whole-run throughput as a % of it."""
    rows = []
    for s in pools:
        ctx.runner.run(s, REFERENCE)
        ref = ctx.runner.cache[ctx.runner.key(s, REFERENCE)]
        whole = {p: ctx.runner.cache[ctx.runner.key(s, p)] for p in by_pool[s.name]}
        rows.append([s.name, tok(ref["throughput_tok_s"]), sec(ref["latency_p95_s"])] + [
            pct(distance(whole[p], ref)["throughput_fraction_of_reference"]) if p in whole else "-"
            for p in HOMOGENEOUS_POLICIES])
    return rows
