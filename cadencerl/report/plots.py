"""The report's figures (matplotlib, Agg backend). Each function writes one PNG and returns its path.

Every figure has labelled axes with units and a legend; the captions live in the report markdown.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

POLICY_COLORS = {
    "cadence": "#d62728", "sync": "#7f7f7f", "one-off": "#bcbd22", "dora": "#9467bd",
    "laminar": "#1f77b4", "areal": "#2ca02c", "least-loaded": "#8c564b",
    "misa+cache-aware-tuned": "#d62728", "cache-aware-tuned": "#1f77b4", "round-robin": "#7f7f7f",
    "least-loaded-router": "#8c564b", "misa+cadence": "#ff7f0e",
}
ACCEL_COLORS = {"H800": "#d62728", "A910X": "#1f77b4", "BI-V150": "#2ca02c"}


def _color(policy: str) -> str:
    return POLICY_COLORS.get(policy, "#17becf")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, groups: list[str], policies: list[str], values: dict[tuple[str, str], float]) -> None:
    """Grouped bars: one group per x label, one bar per policy; (group, policy) pairs not in `values` are skipped."""
    width = 0.8 / max(len(policies), 1)
    for i, p in enumerate(policies):
        xs = [g for g, grp in enumerate(groups) if (grp, p) in values]
        ys = [values[(groups[g], p)] for g in xs]
        ax.bar([x - 0.4 + width * (i + 0.5) for x in xs], ys, width, label=p, color=_color(p),
               edgecolor="black" if p == "cadence" else "none", linewidth=0.8)
    _xlabels(ax, groups)
    ax.grid(axis="y", alpha=0.3)


def _xlabels(ax, labels: list[str]) -> None:
    """Category labels, slanted when they would collide."""
    slant = sum(len(x) + 3 for x in labels) > 70
    ax.set_xticks(range(len(labels)), labels, rotation=25 if slant else 0, ha="right" if slant else "center")


def policy_bars(path: Path, groups: list[str], policies: list[str], throughput: dict, p95: dict,
                group_label: str) -> Path:
    """Two panels: aggregate decode throughput (top) and P95 trajectory latency (bottom) per group and policy."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7.0, 1.3 * len(groups) + 4), 7), sharex=True)
    _bars(top, groups, policies, {k: v / 1000 for k, v in throughput.items()})
    top.set_ylabel("decode throughput (k tokens/s)")
    _bars(bottom, groups, policies, p95)
    bottom.set_ylabel("P95 trajectory latency (s)")
    bottom.set_xlabel(group_label)
    top.legend(title="policy", ncol=min(len(policies), 4), fontsize=8, loc="upper left", bbox_to_anchor=(0, 1.32))
    return _save(fig, path)


def metric_bars(path: Path, groups: list[str], policies: list[str], values: dict, ylabel: str,
                group_label: str) -> Path:
    """One panel of grouped bars (e.g. tokens per dollar per pool and policy)."""
    fig, ax = plt.subplots(figsize=(min(13.0, max(7.0, 0.9 * len(groups) + 3)), 4.6))
    _bars(ax, groups, policies, values)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(group_label)
    top = max(values.values(), default=1.0)
    ax.set_ylim(0, top * 1.3)  # room above the bars for the legend
    ax.legend(title="policy", ncol=min(len(policies), 4), fontsize=8, loc="upper center")
    return _save(fig, path)


def composability(path: Path, points: dict[str, tuple[float, float]],
                  moves: list[tuple[str, str, str]]) -> Path:
    """CadenceRL per pool in the (throughput, P95) plane; an arrow per pool extension, coloured by what was added.

    `points`: pool -> (throughput tok/s, P95 s); `moves`: (from pool, to pool, kind) with kind
    'high-bandwidth' or 'cost-efficient'.
    """
    colors = {"high-bandwidth": "#d62728", "cost-efficient": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    for pool, (tp, p95) in points.items():
        ax.scatter(tp / 1000, p95, color="black", zorder=3, s=18)
        ax.annotate(pool, (tp / 1000, p95), textcoords="offset points", xytext=(5, 4), fontsize=8)
    seen = set()
    for src, dst, kind in moves:
        (x0, y0), (x1, y1) = points[src], points[dst]
        ax.annotate("", xy=(x1 / 1000, y1), xytext=(x0 / 1000, y0),
                    arrowprops=dict(arrowstyle="->", color=colors[kind], lw=1.4, alpha=0.8))
        if kind not in seen:  # proxy artist so the arrow kinds appear in the legend
            ax.plot([], [], color=colors[kind], label=f"adds {kind} devices")
            seen.add(kind)
    ax.set_xlabel("CadenceRL decode throughput (k tokens/s)")
    ax.set_ylabel("CadenceRL P95 trajectory latency (s)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def context_timeline(path: Path, timeline: list[dict], accelerators: list[str], publish_times: list[float]) -> Path:
    """Mean resident context per accelerator type over simulated time; dotted lines mark policy publications."""
    fig, ax = plt.subplots(figsize=(8.5, 4.4))
    ts = [p["t"] for p in timeline]
    for acc in accelerators:
        ys = [p.get(acc, math.nan) for p in timeline]
        ax.plot(ts, ys, label=acc, color=ACCEL_COLORS.get(acc), lw=1.3)
    for i, t in enumerate(publish_times):
        ax.axvline(t, color="grey", ls=":", lw=1, label="policy version published" if i == 0 else None)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("mean context of resident trajectories (tokens)")
    ax.grid(alpha=0.3)
    ax.legend(title="accelerator type", fontsize=8)
    return _save(fig, path)


def kv_share(path: Path, traces: dict[str, list[list]], completed_at: dict[str, float]) -> Path:
    """One panel per policy: the traced trajectory's share of its worker's KV over its life.

    The line breaks (and the band is shaded) wherever the trajectory is not resident on any worker.
    Time is measured from the trajectory's admission.
    """
    fig, axes = plt.subplots(len(traces), 1, figsize=(8.5, 2.6 * len(traces) + 0.6), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (policy, pts) in zip(axes[:, 0], traces.items()):
        t0 = pts[0][0] if pts else 0.0
        ts = [p[0] - t0 for p in pts]
        ys = [p[3] if p[1] is not None else math.nan for p in pts]
        ax.plot(ts, ys, color=_color(policy), lw=1.4, label=f"{policy}: KV share while resident")
        shaded = False
        for (ta, acc, *_), tb in zip(pts, ts[1:] + ts[-1:]):
            if acc is None:
                ax.axvspan(ta - t0, tb, color="grey", alpha=0.25, lw=0, label=None if shaded else "not resident")
                shaded = True
        if policy in completed_at:
            ax.axvline(completed_at[policy] - t0, color="black", ls="--", lw=1, label="completed")
        ax.set_ylabel("KV share of worker (0-1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("time since admission (s)")
    return _save(fig, path)


def sweep(path: Path, xs: list[int], throughput: list[float], p95: list[float], xlabel: str) -> Path:
    """Two panels over one knob: throughput (left) and P95 latency (right)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    left.plot(xs, [v / 1000 for v in throughput], "o-", color=_color("cadence"), label="cadence")
    left.set_ylabel("decode throughput (k tokens/s)")
    right.plot(xs, p95, "s-", color=_color("cadence"), label="cadence")
    right.set_ylabel("P95 trajectory latency (s)")
    for ax in (left, right):
        ax.set_xlabel(xlabel)
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if max(xs) / max(min(xs), 1) >= 8:
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
    return _save(fig, path)


def non_resident(path: Path, pools: list[str], p50: list[float], p95: list[float]) -> Path:
    """P50 and P95 of the fraction of each trajectory's life spent off every worker, per pool."""
    fig, ax = plt.subplots(figsize=(max(7.0, 0.8 * len(pools) + 3), 4.4))
    xs = list(range(len(pools)))
    ax.bar([x - 0.2 for x in xs], [100 * v for v in p50], 0.4, label="P50", color="#9ecae1")
    bars = ax.bar([x + 0.2 for x in xs], [100 * v for v in p95], 0.4, label="P95", color="#08519c")
    ax.bar_label(bars, labels=[f"{100 * v:.0f}%" for v in p95], fontsize=7, padding=2)
    _xlabels(ax, pools)
    ax.set_xlabel("pool (CadenceRL)")
    ax.set_ylabel("non-resident time (% of trajectory life)")
    ax.set_ylim(0, min(100.0, max(10.0, 118 * max(p95, default=0.0))))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="percentile over trajectories", fontsize=8)
    return _save(fig, path)


def bound_scatter(path: Path, runs: list[dict]) -> Path:
    """Every run as a point: P95 as a multiple of the latency bound (x) vs throughput as a fraction of the bound (y)."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        ax.scatter([r["p95_multiple_of_bound"] for r in mine], [100 * r["throughput_fraction_of_bound"] for r in mine],
                   color=_color(policy), label=policy, s=36 if policy == "cadence" else 20,
                   edgecolor="black" if policy == "cadence" else "none", zorder=3 if policy == "cadence" else 2)
    ax.set_xlabel("P95 latency / P95 latency bound (x, 1 = bound)")
    ax.set_ylabel("throughput / throughput bound (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(title="policy (one point per pool)", fontsize=8)
    return _save(fig, path)


def mixture_over_batches(path: Path, batch_mix: dict[str, list[dict]], target: dict[str, float]) -> Path:
    """One panel per policy: each consumed batch's class shares over iterations (solid), and the
    trainer's target share of each class (dashed)."""
    policies = list(batch_mix)
    fig, axes = plt.subplots(len(policies), 1, figsize=(8, 2.6 * len(policies) + 0.6), sharex=True, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, p in zip(axes[:, 0], policies):
        batches = batch_mix[p]
        xs = list(range(len(batches)))
        for i, (cls, share) in enumerate(target.items()):
            ys = [100 * b.get(cls, 0) / max(1, sum(b.values())) for b in batches]
            c = colors[i % len(colors)]
            ax.plot(xs, ys, marker=".", color=c, label=f"{cls} (batch)")
            ax.axhline(100 * share, color=c, linestyle="--", linewidth=1, label=f"{cls} target")
        ax.set_title(p, fontsize=10)
        ax.set_ylabel("share of batch (%)")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("consumed batch (training iteration)")
    axes[0, 0].legend(fontsize=7, ncol=len(target), loc="upper right")
    return _save(fig, path)
