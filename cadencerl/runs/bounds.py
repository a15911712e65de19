"""The physical bound: what no policy could beat on this pool and workload (an explicit oracle).

This is the one place outside the engine that opens the sealed target lengths, and it is named
so. Derivation (also in the report):

* Throughput. Every generated token at context c reads c tokens of KV, so the KV bytes of a run
  are fixed by the lengths: sum over trajectories of kv_bytes * (P*L + L*(L-1)/2) for a prompt of
  P and a response of L (plus observation tokens for multi-turn). Every decode step also reads
  the weights once; a step on worker j serves at most n_j = min(max_num_seqs_j, KV_j / (Pmin+1))
  sequences, so each token costs at least W(n)/n weight bytes with n the largest n_j (W(n) is the
  bytes of weights a batch of n touches; all of them for a dense model). The pool reads at most
  sum_j eff_bw_j * BW_j bytes per second, so the makespan is at least
      (KV bytes + tokens * W(n)/n) / sum_j (eff_bw_j * BW_j)
  and throughput is at most tokens / that.
* Latency. A trajectory cannot finish faster than decoding alone (batch 1) on the fastest worker
  type, prefill and waiting excluded. Each policy's latency is at least this per trajectory, so
  every percentile of it is at least the same percentile of the bounds.
"""

from __future__ import annotations

import numpy as np

from cadencerl.core.worker import Worker
from cadencerl.hardware.catalog import GB
from cadencerl.hardware.perf import WorkerPerf
from cadencerl.core.spec import TrajectorySpec


def _segments(spec: TrajectorySpec, key: object) -> list[tuple[int, int]]:
    """(context at the start, tokens generated) for each turn."""
    ctx = spec.prompt_len
    out = []
    first = spec.response.reveal(key)
    out.append((ctx, first))
    ctx += first
    for turn in spec.later_turns:
        ctx += turn.observation_len
        n = turn.response.reveal(key)
        out.append((ctx, n))
        ctx += n
    return out


def oracle_bounds(specs: list[TrajectorySpec], workers: list[Worker], perfs: list[WorkerPerf], key: object) -> dict:
    segs = [_segments(s, key) for s in specs]
    tokens = sum(n for ss in segs for _c, n in ss)
    kv_tokens_read = sum(n * c + n * (n - 1) // 2 for ss in segs for c, n in ss)
    kv_bytes = kv_tokens_read * perfs[0].kv_bytes_per_token
    min_ctx = min(s.prompt_len for s in specs) + 1
    per_step = [min(w.max_num_seqs, w.kv_capacity // min_ctx) for w in workers]
    best = max(range(len(workers)), key=lambda i: per_step[i])
    n = max(1, per_step[best])
    weight_per_token = perfs[best].weight_bytes_read(n) / n
    bandwidth = sum(p.accel.bw_efficiency * p.accel.mem_bw_gbs * GB * p.tp for p in perfs)
    makespan = (kv_bytes + tokens * weight_per_token) / bandwidth
    distinct = {(p.accel.name, p.tp): p for p in perfs}.values()
    latency = np.array([min(sum(p.decode_line(1, c).time(n) for c, n in ss) for p in distinct) for ss in segs])
    return {
        "bound_throughput_tok_s": tokens / makespan if makespan > 0 else 0.0,
        "bound_latency_p50_s": float(np.percentile(latency, 50)),
        "bound_latency_p95_s": float(np.percentile(latency, 95)),
        "bound_latency_p99_s": float(np.percentile(latency, 99)),
    }


def add_bounds(result: dict, specs: list[TrajectorySpec], workers: list[Worker], perfs: list[WorkerPerf],
               key: object) -> dict:
    """Add the oracle bounds to a run's figures, and how far the run is from them (both backends)."""
    result.update(oracle_bounds(specs, workers, perfs, key))
    result["throughput_fraction_of_bound"] = result["throughput_tok_s"] / result["bound_throughput_tok_s"]
    result["p95_multiple_of_bound"] = result["latency_p95_s"] / max(result["bound_latency_p95_s"], 1e-12)
    return result
