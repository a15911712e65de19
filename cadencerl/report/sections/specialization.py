"""Section 4: which accelerator type carries the long contexts, over time."""

from __future__ import annotations

from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import md_table, tok
from cadencerl.report.matrix import DETAIL_POOL, HETEROGENEOUS_POLICIES, pool_scenario


def _window_context(result: dict, accels: list[str]) -> tuple[dict[str, float], float | None]:
    """Mean context per type over the samples where every type has residents, and the end of that window (s);
    None when no sample has every type busy."""
    both = [p for p in result["context_timeline"] if all(a in p for a in accels)]
    means = {a: sum(p[a] for p in both) / len(both) if both else 0.0 for a in accels}
    return means, (both[-1]["t"] if both else None)


def specialization(ctx: Report) -> str:
    """Section 4: mean resident context per accelerator type over time, CadenceRL on DETAIL_POOL."""
    s = pool_scenario(DETAIL_POOL, ctx.settings)
    results = ctx.run_all(s, HETEROGENEOUS_POLICIES)
    me = results["cadence"]
    accels = list(me["per_accelerator"])
    publish, t = [], 0.0
    for dt in me["iteration_times_s"]:
        t += dt
        publish.append(t)
    path, rel = ctx.figure("context_timeline")
    window = {p: _window_context(r, accels) for p, r in results.items()}
    plots.context_timeline(path, me["context_timeline"], accels, publish,
                           f"CadenceRL on {DETAIL_POOL}: mean resident context per accelerator type",
                           busy_until=window["cadence"][1])
    rows = [[acc] + [f"{tok(results[p]['per_accelerator'][acc]['mean_context'])} / {tok(window[p][0][acc])}"
                     for p in HETEROGENEOUS_POLICIES] for acc in accels]
    top_run = {p: max(accels, key=lambda a: r["per_accelerator"][a]["mean_context"]) for p, r in results.items()}
    top_win = {p: max(accels, key=lambda a: window[p][0][a]) if window[p][1] is not None else "- (never all busy)"
               for p in results}
    end = window["cadence"][1]
    verdict = (f"while every type holds work (up to t = {end:.0f} s) the longest mean context under "
               f"CadenceRL is on {top_win['cadence']}; averaged over the whole run (the tail included, when only "
               f"some types still hold work) it is on {top_run['cadence']}." if end is not None else
               "no sample has every type holding work under CadenceRL, so the types cannot be compared over one "
               f"period; averaged over the whole run the longest mean context is on {top_run['cadence']}.")
    if end is not None and top_win["cadence"] != "H800":
        ctx.mismatches.append(f"specialization on {DETAIL_POOL}: H800 does not carry the longest mean context under "
                              f"CadenceRL while all types are busy ({top_win['cadence']} does).")
    return "\n".join([
        "## 4. Specialization: mean context per accelerator type over time\n",
        "Paper (Figure 13): H800 workers sustain longer mean contexts than A910X and BI-V150 workers; under high "
        "load all types carry elevated contexts and specialization re-emerges as load subsides.\n",
        ctx.setup_line(s), "",
        f"Reproduce: {ctx.command('sim', s, 'cadence')} (`context_timeline` in its `--json` output)\n",
        "Mean context of resident trajectories (tokens) per accelerator type and policy, as *whole run / while every "
        "type holds work*. The whole-run figure is `per_accelerator.mean_context` (averaged over every sample of "
        "that type); the second averages only the samples up to the last time all three types had residents, so "
        "the types are compared over the same period.\n",
        md_table(["accelerator", *HETEROGENEOUS_POLICIES], rows), "",
        f"Measured: {verdict} Type with the longest mean context while all are busy, per policy: "
        + ", ".join(f"{p} {a}" for p, a in top_win.items()) + ".\n",
        f"![context timeline]({rel})\n",
        f"*Figure 4. CadenceRL on {DETAIL_POOL}: mean context (tokens) of the trajectories resident on each "
        "accelerator type, sampled over simulated time (seconds). Dotted vertical lines mark when the trainer "
        "published a new policy version (an iteration whose batch was already complete when the training step before "
        "it ended lasts only its own step, so its line sits close to the one before). Shaded: after the last time "
        "every type held work.*\n"])
