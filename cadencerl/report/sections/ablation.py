"""Section 11: what each CadenceRL mechanism buys (the ablation), and the baselines with the
prefix-aware group routing of their real deployments beside their plain versions."""

from __future__ import annotations

from cadencerl.report.context import Report
from cadencerl.report.markdown import best_of, change, md_table, pct, ratio, sec, tok
from cadencerl.report.matrix import ABLATION_POLICIES, GROUPED_BASELINES, HETEROGENEOUS_POLICIES, pool_scenario

WHAT = {
    "cadence": "everything on (the defaults)",
    "cadence-no-pacing": "no long-out eviction below the floor",
    "cadence-no-concentration": "no affinity drain once the budget is spent (pacing rules throughout)",
    "cadence-no-affinity": "no prompt affinity (tight fit / spread only)",
    "cadence-no-kv-prep": "every move re-prefills (no KV staging)",
}

KNOBS = (
    "How the baselines are set (each at its published design, with the same eta as CadenceRL so that every policy "
    "has the same staleness budget): Sync and One-off dispatch each batch to the least-loaded worker behind a "
    "barrier and have no other knob; Laminar repacks a version's tail from workers under 25% of their sequence "
    "slots onto workers keeping 10% KV free (its paper gives no numbers; these keep repacks from overfilling a "
    "target) and advances each worker on its own; AReaL interrupts on every publish and dispatches round-robin "
    "with `max_head_offpolicyness` = eta, as its client does; least-loaded is the naive floor. `--grouped` adds "
    "group affinity to each: the samples of one prompt go where the previous one went while it is a candidate, "
    "as verl's and SGLang's routers keep a prompt's samples together.")


def _ablation_rows(name: str, results: dict[str, dict]) -> list[list]:
    base = results["cadence"]
    return [[name, p, WHAT[p], tok(r["throughput_tok_s"]), change(r["throughput_tok_s"], base["throughput_tok_s"]),
             sec(r["latency_p95_s"]), change(r["latency_p95_s"], base["latency_p95_s"]),
             sec(r.get("latency_from_submit_p95_s", 0.0)), pct(r["non_resident_p95"]), r["evictions"],
             r["preemptions"], pct(r["prefix_hit_rate"])] for p, r in results.items()]


def _grouped_rows(ctx: Report, name: str, plain: dict[str, dict], grouped: dict[str, dict]) -> list[list]:
    rows = []
    for g, rg in grouped.items():
        p = g.removesuffix("-grouped")
        rp = plain[p]
        rows.append([name, p, tok(rp["throughput_tok_s"]), tok(rg["throughput_tok_s"]), sec(rp["latency_p95_s"]),
                     sec(rg["latency_p95_s"]), pct(rp["prefix_hit_rate"]), pct(rg["prefix_hit_rate"])])
    me = plain["cadence"]
    everyone = {**{p: r for p, r in plain.items() if p != "cadence"}, **grouped}
    tp_name, tp_best = best_of(everyone, "throughput_tok_s", everyone, maximize=True)
    lat_name, lat_best = best_of(everyone, "latency_p95_s", everyone, maximize=False)
    for other, best, metric, worse in ((tp_name, tp_best, "throughput_tok_s", me["throughput_tok_s"] < tp_best["throughput_tok_s"]),
                                       (lat_name, lat_best, "latency_p95_s", me["latency_p95_s"] > lat_best["latency_p95_s"])):
        if worse and other.endswith("-grouped"):
            ctx.losses.append(f"{name}: with group affinity, {other} beats CadenceRL on {metric} "
                              f"({change(me[metric], best[metric])} for CadenceRL).")
    rows.append([name, "**cadence vs best of both**", "", f"{ratio(me['throughput_tok_s'] / tp_best['throughput_tok_s'])} "
                 f"({tp_name})", "", f"{ratio(me['latency_p95_s'] / lat_best['latency_p95_s'])} ({lat_name})", "", ""])
    return rows


def ablation(ctx: Report) -> str:
    """Section 11: the ablation table and the grouped baselines, on the settings' ablation pools."""
    pools = ctx.settings.ablation_pools
    abl_rows, grp_rows, commands = [], [], []
    baselines = [p for p in HETEROGENEOUS_POLICIES if p != "cadence"]
    for name in pools:
        s = pool_scenario(name, ctx.settings)
        abl_rows += _ablation_rows(name, ctx.run_all(s, ABLATION_POLICIES))
        plain = ctx.run_all(s, ["cadence", *baselines])
        grp_rows += _grouped_rows(ctx, name, plain, ctx.run_all(s, GROUPED_BASELINES))
        grouped = [p.removesuffix("-grouped") for p in GROUPED_BASELINES]
        commands.append(f"- {name}: {ctx.command('compare', s, ABLATION_POLICIES)}, "
                        f"{ctx.command('compare', s, grouped).removesuffix('`')} --grouped`")
    where = "every heterogeneous pool" if len(pools) > 1 else f"{pools[0]} (--quick; the full report runs every heterogeneous pool)"
    return "\n".join([
        "## 11. Ablation and grouped baselines\n",
        f"CadenceRL with one mechanism switched off at a time, on {where}; changes are against the full policy "
        "(first row of each pool): the paper's four ablations. The choices it leaves open are variant files "
        "(benchmarks/variants/), measured in docs/policies/cadence.md.\n",
        ctx.setup_line(pool_scenario(pools[0], ctx.settings)), "",
        md_table(["pool", "policy", "what is off", "throughput tok/s", "vs cadence", "P95 s", "vs cadence",
                  "P95 from submission s", "non-resident P95", "evictions", "preemptions", "prefix hits"], abl_rows), "",
        "### The baselines with group affinity\n", KNOBS, "",
        md_table(["pool", "baseline", "plain tok/s", "grouped tok/s", "plain P95 s", "grouped P95 s",
                  "plain prefix hits", "grouped prefix hits"], grp_rows), "",
        "The last row per pool compares CadenceRL with the best of the plain and the grouped baselines (ratio > 1 "
        "throughput and < 1 P95: CadenceRL better).\n",
        "Reproduce:\n", *commands, ""])
