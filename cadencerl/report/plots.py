"""The report's figures (matplotlib, Agg backend). Each function writes one PNG and returns its path.

Every figure has a title (so a PNG opened alone says what it shows), labelled axes with units and a
legend kept off the data; the longer captions live in the report markdown. A policy has one colour in
every figure; routers, accelerator types and pool extensions have palettes of their own.
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
    # the routers of the mixed-workload section: none shares a colour with a policy above
    "misa+cache-aware-tuned": "#e377c2", "cache-aware-tuned": "#17becf", "round-robin": "#c7c7c7",
    "least-loaded-router": "#c49c94", "misa+cadence": "#ff7f0e",
}
ACCEL_COLORS = {"H800": "#1b9e77", "A910X": "#d95f02", "BI-V150": "#7570b3"}    # ColorBrewer Dark2
EXTENSION_STYLES = {"high-bandwidth": ("black", "-"), "cost-efficient": ("#666666", "--")}


OTHER_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")    # none of the above


def policy_color(policy: str, i: int = 0) -> str:
    """A policy's colour; one not in the table takes the i-th of colours no known policy has."""
    return POLICY_COLORS.get(policy) or OTHER_COLORS[i % len(OTHER_COLORS)]


def _color(policy: str) -> str:
    return policy_color(policy)


def _save(fig, path: Path, title: str) -> Path:
    """Title the figure and write it; `bbox_inches="tight"` keeps a legend placed outside the axes."""
    fig.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _bars(ax, groups: list[str], policies: list[str], values: dict[tuple[str, str], float],
          fmt: str | None = None) -> None:
    """Grouped bars: one group per x label, one bar per policy that ran there, centred on the label (a
    policy that did not run on a pool leaves no gap that reads as a zero); `fmt` labels each bar."""
    width = 0.8 / max(len(policies), 1)
    xs: dict[str, list[float]] = {p: [] for p in policies}
    for g, group in enumerate(groups):
        present = [p for p in policies if (group, p) in values]
        for i, p in enumerate(present):
            xs[p].append(g + width * (i - (len(present) - 1) / 2))
    for p in (p for p in policies if xs[p]):        # one that ran nowhere gets no legend entry either
        ys = [values[(group, p)] for group in groups if (group, p) in values]
        bars = ax.bar(xs[p], ys, width, label=p, color=_color(p),
                      edgecolor="black" if p == "cadence" else "none", linewidth=0.8)
        if fmt:
            ax.bar_label(bars, fmt=fmt, fontsize=7, padding=1)
    _xlabels(ax, groups)
    ax.grid(axis="y", alpha=0.3)


def _xlabels(ax, labels: list[str]) -> None:
    """Category labels, slanted when they would collide."""
    slant = sum(len(x) + 3 for x in labels) > 70
    ax.set_xticks(range(len(labels)), labels, rotation=25 if slant else 0, ha="right" if slant else "center")


def policy_bars(path: Path, groups: list[str], policies: list[str], throughput: dict, p95: dict,
                p95_submit: dict, group_label: str, title: str) -> Path:
    """Three panels per group and policy: aggregate decode throughput, P95 trajectory latency from admission
    (the paper's), and from submission (what a policy cannot lower by holding work back before admitting it)."""
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(max(7.0, 1.3 * len(groups) + 4), 9.5), sharex=True)
    _bars(top, groups, policies, {k: v / 1000 for k, v in throughput.items()})
    top.set_ylabel("decode throughput\n(k tokens/s)")
    _bars(middle, groups, policies, p95)
    middle.set_ylabel("P95 latency (s)\nfrom admission")
    _bars(bottom, groups, policies, p95_submit)
    bottom.set_ylabel("P95 latency (s)\nfrom submission")
    bottom.set_xlabel(group_label)
    top.legend(title="policy", ncol=min(len(policies), 4), fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.02))
    return _save(fig, path, title)


def metric_bars(path: Path, groups: list[str], policies: list[str], values: dict, ylabel: str,
                group_label: str, title: str, fmt: str | None = None) -> Path:
    """One panel of grouped bars (e.g. tokens per dollar per pool and policy), each labelled with `fmt`."""
    fig, ax = plt.subplots(figsize=(min(13.0, max(7.0, 0.9 * len(groups) + 3)), 4.6))
    _bars(ax, groups, policies, values, fmt)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(group_label)
    ax.set_ylim(0, max(values.values(), default=1.0) * 1.12)    # room for the bar labels
    ax.legend(title="policy", ncol=min(len(policies), 3), fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.02))
    return _save(fig, path, title)


def composability(path: Path, points: dict[str, tuple[float, float]],
                  moves: list[tuple[str, str, str]], title: str) -> Path:
    """CadenceRL per pool in the (throughput, P95) plane; an arrow per pool extension, styled by what was added.

    `points`: pool -> (throughput tok/s, P95 s); `moves`: (from pool, to pool, kind) with kind
    'high-bandwidth' or 'cost-efficient'. Arrows bend (two into one pool would lie on each other) and
    stop short of the points, so the pool labels stay readable.
    """
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    for pool, (tp, p95) in points.items():
        ax.scatter(tp / 1000, p95, color="black", zorder=3, s=18)
        ax.annotate(pool, (tp / 1000, p95), textcoords="offset points", xytext=(6, -11), fontsize=8, zorder=4,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    for src, dst, kind in moves:
        (x0, y0), (x1, y1) = points[src], points[dst]
        color, style = EXTENSION_STYLES[kind]
        ax.annotate("", xy=(x1 / 1000, y1), xytext=(x0 / 1000, y0),
                    arrowprops=dict(arrowstyle="->", color=color, ls=style, lw=1.3, shrinkA=5, shrinkB=5,
                                    connectionstyle="arc3,rad=0.15"))
    for kind, (color, style) in EXTENSION_STYLES.items():   # proxy artists: the arrow kinds in the legend
        ax.plot([], [], color=color, ls=style, label=f"adds {kind} devices")
    ax.set_xlabel("CadenceRL decode throughput (k tokens/s)")
    ax.set_ylabel("CadenceRL P95 trajectory latency (s)")
    ax.margins(x=0.08, y=0.1)       # the labels, set below and right of their points, stay inside the frame
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.02), ncol=2, fontsize=8)
    return _save(fig, path, title)


def context_timeline(path: Path, timeline: list[dict], accelerators: list[str], publish_times: list[float],
                     title: str, busy_until: float | None = None) -> Path:
    """Mean resident context per accelerator type over simulated time; dotted lines mark policy publications,
    and the time after `busy_until` (when some type has run dry) is shaded."""
    fig, ax = plt.subplots(figsize=(8.5, 4.4))
    ts = [p["t"] for p in timeline]
    for acc in accelerators:
        ys = [p.get(acc, math.nan) for p in timeline]
        ax.plot(ts, ys, label=acc, color=ACCEL_COLORS.get(acc), lw=1.3)
    for i, t in enumerate(publish_times):
        ax.axvline(t, color="grey", ls=":", lw=1, label="policy version published" if i == 0 else None)
    if busy_until is not None and ts and busy_until < ts[-1]:
        ax.axvspan(busy_until, ts[-1], color="grey", alpha=0.12, lw=0, label="tail: not every type busy")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("mean context of resident trajectories (tokens)")
    ax.grid(alpha=0.3)
    ax.legend(title="accelerator type", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path, title)


def kv_share(path: Path, traces: dict[str, list[list]], completed_at: dict[str, float], title: str) -> Path:
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
            ax.axvline(completed_at[policy] - t0, color="black", ls="--", lw=1, label="last tick before completion")
        ax.set_ylabel("share of the worker's\nused KV (0-1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("time since admission (s)")
    return _save(fig, path, title)


def sweep(path: Path, xs: list[int], throughput: list[float], p95: list[float], xlabel: str, title: str) -> Path:
    """Two panels over one knob: throughput (left) and P95 latency (right), both from zero so a change
    looks its size."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    left.plot(xs, [v / 1000 for v in throughput], "o-", color=_color("cadence"), label="cadence")
    left.set_ylabel("decode throughput (k tokens/s)")
    right.plot(xs, p95, "s-", color=_color("cadence"), label="cadence")
    right.set_ylabel("P95 trajectory latency (s)")
    for ax in (left, right):
        ax.set_xlabel(xlabel)
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0, top=1.1 * max(ax.get_ylim()[1], 1e-9))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    if max(xs) / max(min(xs), 1) >= 8:
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel(f"{xlabel}, log2 scale")
    return _save(fig, path, title)


def non_resident(path: Path, pools: list[str], p50: list[float], p95: list[float], title: str) -> Path:
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
    return _save(fig, path, title)


def bound_scatter(path: Path, runs: list[dict], title: str) -> Path:
    """Every run as a point: P95 as a multiple of the latency bound (x) vs throughput as a fraction of the bound
    (y). CadenceRL's points are open rings over the others, so they hide none."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        xs, ys = [r["p95_multiple_of_bound"] for r in mine], [100 * r["throughput_fraction_of_bound"] for r in mine]
        if policy == "cadence":
            ax.scatter(xs, ys, facecolor="none", edgecolor=_color(policy), linewidth=1.5, s=70, label=policy, zorder=3)
        else:
            ax.scatter(xs, ys, color=_color(policy), label=policy, s=20, zorder=2)
    ax.set_xlabel("P95 latency / P95 latency bound (x, 1 = bound)")
    ax.set_ylabel("throughput / throughput bound (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(title="policy (one point per pool)", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path, title)


def mixture_over_batches(path: Path, batch_mix: dict[str, list[dict]], target: dict[str, float], title: str) -> Path:
    """One panel per policy, on one y scale so the swings compare: each consumed batch's class shares over
    iterations (solid), and the trainer's target share of each class (dashed)."""
    policies = list(batch_mix)
    fig, axes = plt.subplots(len(policies), 1, figsize=(8, 2.6 * len(policies) + 0.6), sharex=True, sharey=True,
                             squeeze=False)
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
    axes[-1, 0].legend(fontsize=7, ncol=len(target), loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return _save(fig, path, title)
