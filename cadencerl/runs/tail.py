"""Where the slowest trajectories spend their time, and what decoding alone would cost them.

A P95 is judged against what no placement can remove: a trajectory of L tokens needs L decode steps,
and at the batch a worker actually runs each step costs what the roofline says (hardware/perf.py).
This splits the life of each trajectory at or above a percentile (over the steady window, as
`runs/steady.py` draws it) into: queued before admission (from submission: the eta budget let it
start, to admission), resident (on a worker: engine queue, prefill, KV restore and decode), and
non-resident after admission (pending between placements, in flight, at a tool). The resident part
is split once more into decode at the observed batch of the worker type it finished on, and the
rest (prefill, KV preparation, waiting in the engine, preemption recompute, a batch above the mean).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cadencerl.core.recorder import Sample
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker
from cadencerl.hardware.perf import WorkerPerf
from cadencerl.runs.steady import steady_window, submitted_at


def observed_batch(samples: Sequence[Sample], workers: Sequence[Worker],
                   window: tuple[float, float] | None) -> dict[str, dict]:
    """Per accelerator type over `window` (the whole run when None), from the recorder's samples:
    the mean residents of a busy worker, the decode batch (residents capped at max_num_seqs), their
    mean context, the batch a full KV cache would hold at that context, and the share of sample
    times its workers were busy (a worker with no resident is not sampled)."""
    acc: dict[str, list[tuple[int, float, int, int]]] = {}
    times = set()
    for t, wid, mean_ctx, n in samples:
        if window is None or window[0] <= t <= window[1]:
            w = workers[wid]
            times.add(t)
            acc.setdefault(w.accelerator, []).append((n, mean_ctx, w.max_num_seqs, w.kv_capacity))
    count: dict[str, int] = {}
    for w in workers:
        count[w.accelerator] = count.get(w.accelerator, 0) + 1
    out = {}
    for name, rows in acc.items():
        n, ctx, cap, kv = (np.array(col, dtype=float) for col in zip(*rows))
        out[name] = {"residents": float(n.mean()), "decode_batch": float(np.minimum(n, cap).mean()),
                     "mean_context": float(np.average(ctx, weights=n)),
                     "kv_full_batch": float(np.minimum(cap, kv // np.maximum(ctx, 1.0)).mean()),
                     "busy": len(rows) / (len(times) * count[name])}
    return out


def decode_seconds(perf: WorkerPerf, tokens: int, batch: float, mean_context: float) -> float:
    """Decoding `tokens` steps in a steady batch of `batch` sequences of `mean_context` each (the
    batch's total context held constant: finished sequences are replaced by fresh ones)."""
    b = max(1, round(batch))
    return tokens * perf.decode_step_time(b, int(b * mean_context))


def batch_within(perf: WorkerPerf, tokens: int, seconds: float, mean_context: float, limit: int) -> int:
    """The largest batch (at most `limit`) at which `tokens` decode within `seconds`; 0 if not even alone."""
    best = 0
    for b in range(1, limit + 1):
        if decode_seconds(perf, tokens, b, mean_context) > seconds:
            break
        best = b
    return best


def best_split(types: dict[str, dict], share: float) -> float:
    """The most tok/s a clairvoyant split of the pool could give with the tail (a `share` of the
    tokens) served at each type's `worker_tok_s_at_cap` and the rest at its `worker_tok_s_observed`
    (per worker, times `workers`): a two-constraint linear program, solved by giving tail work to
    the types that lose least by it first. An estimate, not a bound: the rest could run a larger
    batch once the tail is gone, and a policy that does not know lengths must also slow the
    trajectories just below the tail."""
    if not 0.0 < share < 1.0:
        return 0.0
    ratio = share / (1.0 - share)          # tail tok/s : other tok/s
    order = sorted(types.values(), key=lambda r: -r["worker_tok_s_at_cap"] / max(r["worker_tok_s_observed"], 1e-9))
    tail, other = 0.0, sum(r["workers"] * r["worker_tok_s_observed"] for r in types.values())
    for r in order:
        cap, obs = r["workers"] * r["worker_tok_s_at_cap"], r["workers"] * r["worker_tok_s_observed"]
        if cap <= 0.0:
            break
        if tail + cap >= ratio * (other - obs):            # this type, in part, balances the split
            f = (ratio * other - tail) / (cap + ratio * obs)
            return (tail + f * cap) / share
        tail, other = tail + cap, other - obs
    return tail / share


def tail_breakdown(trajs: Sequence[Trajectory], order: dict[int, int], batch_size: int, eta: int,
                   publish_times: Sequence[float], step_s: dict[str, float], workers: Sequence[Worker],
                   *, q: float = 95.0, from_submit: bool = False) -> dict:
    """Mean seconds per part for the trajectories completed in the steady window whose latency
    (from admission, or from submission) is at or above its q-th percentile there.

    `step_s` is the decode step time at the observed batch per accelerator type (see
    `decode_seconds`); each trajectory's decode part uses the type of the worker it finished on."""
    batches = -(-len(order) // batch_size)
    window = steady_window(publish_times, batches) or (0.0, float("inf"))
    inside = [t for t in trajs if window[0] <= t.completed_at <= window[1]]
    if not inside:
        return {"trajectories": 0}
    submit = np.array([submitted_at(order[t.id], batch_size, eta, publish_times) for t in inside])
    admit = np.array([t.admitted_at for t in inside])
    done = np.array([t.completed_at for t in inside])
    latency = done - (submit if from_submit else admit)
    cut = float(np.percentile(latency, q))
    tail = latency >= cut
    resident = np.array([t.resident_time for t in inside])
    decode = np.array([t.tokens * step_s.get(workers[t.kv_home].accelerator, 0.0) if t.kv_home is not None else 0.0
                       for t in inside])
    decode = np.minimum(decode, resident)
    parts = {"queued_before_admission_s": admit - submit if from_submit else np.zeros(len(inside)),
             "resident_decode_s": decode, "resident_other_s": resident - decode,
             "non_resident_s": np.maximum(0.0, done - admit - resident)}
    finished_on: dict[str, int] = {}
    for t, keep in zip(inside, tail):
        if keep and t.kv_home is not None:
            name = workers[t.kv_home].accelerator
            finished_on[name] = finished_on.get(name, 0) + 1
    tokens = np.array([t.tokens for t in inside], dtype=float)
    length_at_q = float(np.percentile(tokens, q))
    long = tokens >= length_at_q
    return {"percentile": q, "from_submit": from_submit, "cut_s": cut, "trajectories": int(tail.sum()),
            "length_at_percentile": length_at_q,
            "token_share_at_or_above_it": float(tokens[long].sum() / max(tokens.sum(), 1.0)),
            "latency_s": float(latency[tail].mean()),
            "tokens": float(tokens[tail].mean()),
            **{k: float(v[tail].mean()) for k, v in parts.items()}, "finished_on": finished_on}
