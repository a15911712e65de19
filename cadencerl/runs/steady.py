"""Steady-state figures: a run for days is judged away from its start-up and its drain.

The steady window runs from the publish of version 1 to the publish of version n-1 (n batches, at
least three), or to the last completion where the pool finishes first. Latency is reported from
admission and from submission (when the eta budget let a trajectory start), since holding work back
lowers the former but not the latter. Details: docs/internals.md, "runs/steady".
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

from cadencerl.core.trajectory import Trajectory


def steady_window(publish_times: Sequence[float], batches: int) -> tuple[float, float] | None:
    """(start, end) of the iterations between the first and the last of `batches`, or None with fewer than three."""
    if batches < 3 or len(publish_times) < batches - 1:
        return None
    return publish_times[0], publish_times[batches - 2]


def submitted_at(index: int, batch_size: int, eta: int, publish_times: Sequence[float]) -> float:
    """When the `index`-th trajectory (arrival order) became available under the eta budget."""
    k = index // batch_size - eta
    return 0.0 if k <= 0 else publish_times[min(k, len(publish_times)) - 1]


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def tokens_between(samples: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """Tokens generated in [start, end] from cumulative (time, tokens) samples, linearly interpolated."""
    times = [t for t, _ in samples]

    def at(x: float) -> float:
        i = bisect_left(times, x)
        if i == 0:
            return float(samples[0][1]) if samples else 0.0
        if i >= len(samples):
            return float(samples[-1][1])
        (t0, n0), (t1, n1) = samples[i - 1], samples[i]
        return n0 + (n1 - n0) * ((x - t0) / (t1 - t0) if t1 > t0 else 1.0)

    return at(end) - at(start)


def steady_figures(trajs: Sequence[Trajectory], order: dict[int, int], batch_size: int, eta: int,
                   publish_times: Sequence[float], generated: Sequence[tuple[float, int]] | None) -> dict:
    """Latency from submission (whole run) and every figure over the steady window.

    `order` maps trajectory id to arrival index; `generated` holds cumulative decoded tokens over
    time (without it, the window's throughput counts the tokens of trajectories completed in it)."""
    submit = {t.id: submitted_at(order[t.id], batch_size, eta, publish_times) for t in trajs}
    from_submit = np.array([t.completed_at - submit[t.id] for t in trajs])
    out = {"latency_from_submit_p50_s": _pct(from_submit, 50), "latency_from_submit_p95_s": _pct(from_submit, 95)}
    batches = -(-len(order) // batch_size)
    window = steady_window(publish_times, batches)
    out["steady_window_s"] = list(window) if window else None
    if window is None:
        return out
    start, end = window
    end = min(end, max((t.completed_at for t in trajs), default=end))    # the pool's work ends there
    if end <= start:
        out["steady_window_s"] = None
        return out
    out["steady_window_s"] = [start, end]
    inside = [t for t in trajs if start <= t.completed_at <= end]
    lat = np.array([t.completed_at - t.admitted_at for t in inside])
    sub = np.array([t.completed_at - submit[t.id] for t in inside])
    nonres = np.array([max(0.0, 1.0 - t.resident_time / max(t.completed_at - t.admitted_at, 1e-12)) for t in inside])
    tokens = tokens_between(generated, start, end) if generated else sum(t.tokens for t in inside)
    out.update({
        "steady_iterations": batches - 2,
        "steady_trajectories": len(inside),
        "steady_throughput_tok_s": tokens / (end - start) if end > start else 0.0,
        "steady_latency_p50_s": _pct(lat, 50),
        "steady_latency_p95_s": _pct(lat, 95),
        "steady_latency_p99_s": _pct(lat, 99),
        "steady_latency_from_submit_p50_s": _pct(sub, 50),
        "steady_latency_from_submit_p95_s": _pct(sub, 95),
        "steady_non_resident_p50": _pct(nonres, 50),
        "steady_non_resident_p95": _pct(nonres, 95),
    })
    return out


STEADY_KEYS = {"throughput_tok_s": "steady_throughput_tok_s", "latency_p50_s": "steady_latency_p50_s",
               "latency_p95_s": "steady_latency_p95_s", "latency_p99_s": "steady_latency_p99_s",
               "latency_from_submit_p50_s": "steady_latency_from_submit_p50_s",
               "latency_from_submit_p95_s": "steady_latency_from_submit_p95_s",
               "non_resident_p50": "steady_non_resident_p50", "non_resident_p95": "steady_non_resident_p95"}


def steady_view(result: dict) -> dict:
    """A run's figures with the steady window's in place of the whole run's (kept as `run_*`);
    unchanged when the run had no steady window (fewer than three iterations)."""
    if not result.get("steady_window_s"):
        return result
    out = dict(result)
    for key, steady in STEADY_KEYS.items():
        out["run_" + key] = result[key]
        out[key] = result[steady]
    if result.get("bound_throughput_tok_s"):
        out["throughput_fraction_of_bound"] = out["throughput_tok_s"] / result["bound_throughput_tok_s"]
    if result.get("bound_latency_p95_s"):
        out["p95_multiple_of_bound"] = out["latency_p95_s"] / result["bound_latency_p95_s"]
    return out
