"""The figures of a run, as one JSON-ready dict (the contract of `cadencerl sim --json`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from cadencerl.core.backend import EngineFigures
from cadencerl.core.controller import Controller
from cadencerl.core.trajectory import State
from cadencerl.runs.steady import steady_figures


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def mixture_dtv_pp(batches: list, target: dict[str, float]) -> float:
    """Mean total-variation distance (percentage points) between each consumed batch's class mix
    and the trainer's target mix."""
    if not batches:
        return 0.0
    dists = []
    for counts in batches:
        n = sum(counts.values())
        classes = set(target) | set(counts)
        dists.append(50.0 * sum(abs(counts.get(c, 0) / n - target.get(c, 0.0)) for c in classes))
    return float(np.mean(dists))


def per_class(trajs, engines: Sequence[EngineFigures], makespan: float, batches: list) -> dict[str, dict]:
    by_class = defaultdict(list)
    for t in trajs:
        by_class[t.workload_class].append(t)
    consumed = sum(sum(b.values()) for b in batches) or 1
    out = {}
    for cls, ts in sorted(by_class.items()):
        lat = [t.completed_at - t.admitted_at for t in ts]
        out[cls] = {
            "trajectories": len(ts),
            "throughput_tok_s": sum(t.tokens for t in ts) / makespan if makespan else 0.0,
            "latency_p50_s": _pct(lat, 50),
            "latency_p95_s": _pct(lat, 95),
            "preemptions": int(sum(e.preemptions_by_class.get(cls, 0) for e in engines)),
            "consumed_share": sum(b.get(cls, 0) for b in batches) / consumed,
        }
    return out


def summarize(scenario_name: str, policy_name: str, ctl: Controller, engines: Sequence[EngineFigures],
              wall_time_s: float, events: int, target_mix: dict[str, float] | None = None,
              generated: list[tuple[float, int]] | None = None) -> dict:
    """The run's figures from the controller's record and each engine's totals (`engines[i]` is
    worker i's), the same for a simulated and a real run. `generated`: cumulative decoded tokens
    over time, for the steady window's throughput (without it: tokens of trajectories completed in it)."""
    trajs = [t for t in ctl.trajectories.values() if t.state is State.DONE]
    latency = np.array([t.completed_at - t.admitted_at for t in trajs])
    nonres = np.array([max(0.0, 1.0 - t.resident_time / max(t.completed_at - t.admitted_at, 1e-12)) for t in trajs])
    makespan = max((t.completed_at for t in trajs), default=0.0)
    tokens = sum(t.tokens for t in trajs)
    per_type: dict[str, dict] = {}
    by_type_workers = defaultdict(list)
    for w in ctl.workers:
        by_type_workers[w.accelerator].append(w.id)
    ctx_samples = defaultdict(list)
    for _t, wid, mean_ctx, _n in ctl.counters.samples:
        ctx_samples[ctl.workers[wid].accelerator].append(mean_ctx)
    for acc, ids in by_type_workers.items():
        gen = sum(engines[i].tokens_generated for i in ids)
        per_type[acc] = {
            "workers": len(ids),
            "throughput_tok_s": gen / makespan if makespan else 0.0,
            "mean_context": float(np.mean(ctx_samples[acc])) if ctx_samples[acc] else 0.0,
            "preemptions": sum(engines[i].preemptions for i in ids),
        }
    timeline: dict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t, wid, mean_ctx, _n in ctl.counters.samples:
        timeline[t][ctl.workers[wid].accelerator].append(mean_ctx)
    context_timeline = [{"t": t, **{acc: float(np.mean(v)) for acc, v in per.items()}}
                        for t, per in sorted(timeline.items())]
    publish = ctl.trainer.publish_times
    iterations = np.diff([0.0] + publish).tolist() if publish else []
    c = ctl.counters
    return {
        "scenario": scenario_name,
        "policy": policy_name,
        "throughput_tok_s": tokens / makespan if makespan else 0.0,
        "latency_p50_s": _pct(latency, 50),
        "latency_p95_s": _pct(latency, 95),
        "latency_p99_s": _pct(latency, 99),
        "latency_mean_s": float(latency.mean()) if len(latency) else 0.0,
        "trajectories_submitted": len(ctl.trajectories),
        "trajectories_completed": len(trajs),
        "tokens_generated": int(tokens),
        "preemptions": int(sum(e.preemptions for e in engines)),
        "evictions": c.evictions,
        "migrations": c.migrations,
        "kv_transfers": c.kv_transfers,
        "reprefill_migrations": c.reprefills,
        "migrated_kv_bytes": c.migrated_kv_bytes,
        "migrated_token_bytes": c.migrated_token_bytes,
        "interrupts": c.interrupts,
        "in_place_updates": c.in_place_updates,
        "prefill_tokens": int(sum(e.prefill_tokens for e in engines)),
        **steady_figures(trajs, {tid: i for i, tid in enumerate(ctl.trajectories)}, ctl.credits.batch_size,
                         ctl.credits.eta, publish, generated),
        "non_resident_p50": _pct(nonres, 50),
        "non_resident_p95": _pct(nonres, 95),
        "staleness_histogram": {str(k): v for k, v in sorted(ctl.trainer.staleness.items())},
        "iteration_times_s": iterations,
        "versions_published": ctl.trainer.version,
        "per_accelerator": per_type,
        "prefix_hit_rate": (sum(e.cache.hits for e in engines) / max(1, sum(e.cache.queried for e in engines))),
        "mixture_dtv_pp": mixture_dtv_pp(ctl.trainer.batch_classes, target_mix or {}),
        "mixture_dtv_steady_pp": (mixture_dtv_pp(ctl.trainer.batch_classes[1:-1], target_mix or {})
                                  if len(ctl.trainer.batch_classes) > 2 else None),
        "batch_mix": [dict(b) for b in ctl.trainer.batch_classes],
        "mixture_shortfall": ctl.trainer.mix_shortfall,
        "mixture_short_batches": ctl.trainer.mix_short_batches,
        "per_class": per_class(trajs, engines, makespan, ctl.trainer.batch_classes),
        "context_timeline": context_timeline,
        "longest_trajectory": max(trajs, key=lambda t: t.tokens).id if trajs else None,
        "sim_time_s": makespan,
        "train_end_s": publish[-1] if publish else makespan,
        "wall_time_s": wall_time_s,
        "events": events,
        "decisions": c.decisions,
    }
