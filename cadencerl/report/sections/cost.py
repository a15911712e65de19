"""Section 9: tokens per dollar, where every device type in the pool has a listed price."""

from __future__ import annotations

from cadencerl.hardware.catalog import ACCELERATORS
from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import md_table, pool_price, ratio, tok
from cadencerl.report.matrix import HETEROGENEOUS_POLICIES, HOMOGENEOUS_POLICIES, all_pools


def cost(ctx: Report) -> str:
    """Section 9: tokens per dollar where every device type in the pool has a listed price."""
    rows, values, groups = [], {}, []
    for s in all_pools(ctx.settings):
        price = pool_price(s)
        if price is None:
            rows.append([s.name, sum(g.devices for g in s.pool), "n/a", "", "", "", ""])
            continue
        results = ctx.run_all(s, HOMOGENEOUS_POLICIES if s.name.startswith("h800-16") else HETEROGENEOUS_POLICIES)
        per = {p: r["throughput_tok_s"] * 3600 / price / 1e6 for p, r in results.items()}
        best = max((p for p in per if p != "cadence"), key=per.get)
        groups.append(s.name)
        values.update({(s.name, p): v for p, v in per.items()})
        rows.append([s.name, sum(g.devices for g in s.pool), f"{price:.2f}", tok(results["cadence"]["throughput_tok_s"]),
                     f"{per['cadence']:.2f}", f"{per[best]:.2f} ({best})", ratio(per["cadence"] / per[best])])
    path, rel = ctx.figure("cost")
    plots.metric_bars(path, groups, list(HOMOGENEOUS_POLICIES), values, "million tokens per dollar",
                      "pool (Qwen3-8B unless the pool names its model)", "Decode tokens per dollar, per pool and policy")
    prices = ", ".join(f"{n} ${a.price_per_hour:.2f}" for n, a in ACCELERATORS.items() if a.price_per_hour is not None)
    return "\n".join([
        "## 9. Cost view\n",
        f"Pool price = sum over devices of the per-device-hour price in `cadencerl.hardware.catalog` ({prices} per "
        "device-hour; 2nd-hand, CadenceRL Table 1). Million tokens per dollar = throughput x 3600 / pool $ per hour "
        "/ 1e6. Runs and setups as in sections 1-3.\n",
        md_table(["pool", "devices", "$ / hour", "cadence tok/s", "cadence Mtok / $", "best other Mtok / $",
                  "cadence / best"], rows), "",
        f"![cost]({rel})\n",
        "*Figure 9. Decode tokens per dollar (millions of tokens per dollar of device-hours) per pool and policy, at "
        "the listed device prices. CadenceRL's bars are outlined in black.*\n"])
