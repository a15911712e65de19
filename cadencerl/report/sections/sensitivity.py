"""Section 6: CadenceRL's throughput and tail latency as eta and delta vary."""

from __future__ import annotations

from cadencerl.config import Scenario
from cadencerl.report import plots
from cadencerl.report.context import Report
from cadencerl.report.markdown import change, md_table, pct, sec, tok
from cadencerl.report.matrix import DETAIL_POOL, pool_scenario


def _sweep_rows(ctx: Report, s: Scenario, knob: str, values) -> tuple[list, list[dict]]:
    runs = [ctx.runner.run(s.with_knobs(**{knob: v}), "cadence") for v in values]
    rows = [[v, tok(r["throughput_tok_s"]), sec(r["latency_p95_s"]), sec(r["latency_from_submit_p95_s"]),
             sec(r["latency_p99_s"]), pct(r["non_resident_p95"]), r["evictions"],
             ctx.command("sim", s, "cadence", **{knob: v})] for v, r in zip(values, runs)]
    return rows, runs


def sensitivity(ctx: Report) -> str:
    """Section 6: eta sweep (throughput and P95) and delta sweep (P95) for CadenceRL on DETAIL_POOL."""
    s = pool_scenario(DETAIL_POOL, ctx.settings)
    etas, deltas = list(ctx.settings.etas), list(ctx.settings.deltas)
    eta_rows, eta_runs = _sweep_rows(ctx, s, "eta", etas)
    delta_rows, delta_runs = _sweep_rows(ctx, s, "delta", deltas)
    eta_path, eta_rel = ctx.figure("eta_sweep")
    plots.sweep(eta_path, etas, [r["throughput_tok_s"] for r in eta_runs], [r["latency_p95_s"] for r in eta_runs],
                "eta (admission budget, iteration-batches ahead)", f"CadenceRL on {DETAIL_POOL}: the eta sweep")
    delta_path, delta_rel = ctx.figure("delta_sweep")
    plots.sweep(delta_path, deltas, [r["throughput_tok_s"] for r in delta_runs],
                [r["latency_p95_s"] for r in delta_runs], "delta (decode reserve, tokens)",
                f"CadenceRL on {DETAIL_POOL}: the delta sweep")
    p95s = [r["latency_p95_s"] for r in eta_runs]
    monotone = all(b >= a for a, b in zip(p95s, p95s[1:]))
    dtp = [r["throughput_tok_s"] for r in delta_runs]
    dp95 = [r["latency_p95_s"] for r in delta_runs]
    dsub = [r["latency_from_submit_p95_s"] for r in delta_runs]
    devict = [r["evictions"] for r in delta_runs]
    if not monotone:
        ctx.mismatches.append(f"eta sweep on {DETAIL_POOL}: P95 does not rise monotonically with eta "
                              f"({', '.join(sec(v) for v in p95s)} s for eta {', '.join(map(str, etas))}).")
    if dp95[-1] <= dp95[0]:
        ctx.mismatches.append(f"delta sweep on {DETAIL_POOL}: raising delta from {deltas[0]} to {deltas[-1]} does not "
                              f"raise P95 ({change(dp95[-1], dp95[0])} from admission, "
                              f"{change(dsub[-1], dsub[0])} from submission"
                              f"{'; no trajectory was evicted at any delta' if not any(devict) else ''}).")
    headers = ["value", "throughput tok/s", "P95 s (from admission)", "P95 s (from submission)", "P99 s",
               "non-resident P95", "evictions (whole run)", "reproduce"]
    return "\n".join([
        "## 6. Sensitivity to eta and delta\n",
        "Paper (section 6.3): raising eta from 1 to 3 improves throughput, further increases reduce it, and latency "
        "rises monotonically with eta; raising delta from 512 to 4096 tokens (on Qwen3-14B) leaves throughput stable "
        f"but substantially raises P95. Here both sweeps run CadenceRL on {DETAIL_POOL} (Qwen3-8B), one knob at a "
        "time, the other at its default.\n",
        ctx.setup_line(s, eta="swept", delta=s.cadence.delta), "",
        "### eta\n", md_table(["eta", *headers[1:]], eta_rows), "",
        f"Measured: {_peak('eta', etas, [r['throughput_tok_s'] for r in eta_runs])}; P95 "
        f"{'rises monotonically' if monotone else 'does not rise monotonically'} "
        f"with eta ({', '.join(sec(v) for v in p95s)} s).\n",
        f"![eta sweep]({eta_rel})\n",
        f"*Figure 6a. CadenceRL on {DETAIL_POOL}: aggregate decode throughput (left, thousands of tokens/s) and P95 "
        "trajectory latency (right, seconds) against the admission budget eta (delta = "
        f"{s.cadence.delta} tokens).*\n",
        "### delta\n", ctx.setup_line(s, delta="swept"), "", md_table(["delta", *headers[1:]], delta_rows), "",
        f"Measured: from delta = {deltas[0]} to {deltas[-1]} throughput changes {change(dtp[-1], dtp[0])} and P95 "
        f"changes {change(dp95[-1], dp95[0])} from admission, {change(dsub[-1], dsub[0])} from submission; "
        f"{_delta_reading(deltas, delta_runs)}\n",
        f"![delta sweep]({delta_rel})\n",
        f"*Figure 6b. CadenceRL on {DETAIL_POOL}: aggregate decode throughput (left, thousands of tokens/s) and P95 "
        f"trajectory latency (right, seconds) against the decode reserve delta in tokens (eta = {s.controller.eta}).*\n"])


def _peak(knob: str, values: list, throughput: list[float]) -> str:
    """Where throughput is highest over a sweep, said as the points show it: a peak only where one
    interior point is above both of its neighbours."""
    if len(values) < 2:
        return f"one point only ({knob} = {values[0]})" if values else "no point"
    top = max(throughput)
    best = [i for i, v in enumerate(throughput) if v == top]
    if len(best) > 1:
        return f"throughput is highest, and level, at {knob} = {', '.join(str(values[i]) for i in best)}"
    b = best[0]
    if b == len(values) - 1:
        rising = all(y > x for x, y in zip(throughput, throughput[1:]))
        shape = "rises over the whole range" if rising else "is highest at the largest value tried"
        return f"throughput {shape} ({knob} = {values[b]}; no peak at {knob} <= {values[b]})"
    if b == 0:
        return f"throughput is highest at the smallest value tried ({knob} = {values[0]})"
    return f"throughput peaks at {knob} = {values[b]}"


# what a run's record says it did; two runs equal on all of them did the same work at the same pace
_SAME_RUN = ("throughput_tok_s", "tokens_generated", "sim_time_s", "latency_p50_s", "latency_p95_s",
             "evictions", "migrations")


def _delta_reading(deltas: list[int], runs: list[dict]) -> str:
    """What the runs say about the reserve, which acts through placement (a worker takes a trajectory only
    while its headroom clears floor + delta) and sheds (evictions)."""
    evictions = [r["evictions"] for r in runs]
    if not any(evictions):
        same = len({tuple(r.get(k) for k in _SAME_RUN) for r in runs}) == 1
        return ("no trajectory was evicted at any delta" + (
            " and every run's figures are identical (tokens, time, latency, migrations): the reserve never came "
            "into play on this pool." if same else
            ": what differs comes from placement alone (a worker takes a trajectory only while its headroom clears "
            "the floor plus delta)."))
    counts = ", ".join(f"{e:,} at {d}" for d, e in zip(deltas, evictions))
    if evictions[-1] < evictions[0]:
        why = (" As designed, a larger reserve widens the band between the fill (floor + delta) and the shed line "
               "(the floor): fewer sheds, and each evicted trajectory waits longer for room for its context + delta; "
               "why the two offset: README, 'The decode reserve delta' (`benchmarks/delta_trace.py`).")
    else:
        why = (" Not the fewer sheds a wider band between the fill (floor + delta) and the shed line (the floor) "
               "should give.")
    return f"evictions (whole run): {counts}.{why}"
