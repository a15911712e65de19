"""The physical bound: what no policy could beat on this pool and workload (an explicit oracle).

This is one of the two places outside the engine that open the sealed target lengths (the other is
the clairvoyant reference policy, `policies/oracle.py`, which gets its key from here), and it is
named so. Its derivation is `DERIVATION`, which the report prints.
"""

from __future__ import annotations

import numpy as np

from cadencerl.config import Scenario
from cadencerl.core.spec import TrajectorySpec
from cadencerl.core.worker import Worker
from cadencerl.hardware.catalog import GB
from cadencerl.hardware.perf import WorkerPerf

DERIVATION = """\
* Makespan, three ways; the run cannot end before the largest of them.
  - Bandwidth and step overhead. Every decoded token at context c reads c tokens of KV, so the
    KV bytes of a run are fixed by the lengths: sum over trajectories of kv_bytes * ((L-1)*P +
    L*(L-1)/2) for a prompt of P and a response of L (the first token of a turn comes with its
    prefill, which reads no cached KV; plus observation tokens for multi-turn).
    A decode step on worker j serves at most n_j = min(max_num_seqs_j, KV_j / (Pmin+1))
    sequences and costs at least its fixed time t0_j (launch overhead and TP all-reduces) plus
    reading the weights it touches, W_j(n_j), so each token costs worker j at least
    c_j = (t0_j * BW_j + W_j(n_j)) / n_j bytes-equivalent of its bandwidth BW_j. The pool then
    needs at least (KV bytes + tokens * min_j c_j) / sum_j BW_j seconds.
  - Critical path. No run ends before its slowest trajectory could finish alone (below).
  - Trainer under eta. The last batch (index K-1) holds trajectories tagged K-1-eta or later,
    which cannot start before version K-1-eta exists, i.e. K-1-eta trainings of at least
    train_time_s each; and at least one of its m trajectories takes no less than the m-th
    smallest alone-time.
  Throughput is at most tokens / that makespan.
* Latency. A trajectory cannot finish faster than decoding alone (batch 1) on the fastest worker
  type, plus its tool calls; the first token of each turn comes with its prefill, so only the
  later tokens are counted as decode steps. Each policy's latency is at least this per
  trajectory, so every percentile of it is at least the same percentile of the bounds.
"""


def _segments(spec: TrajectorySpec, key: object) -> list[tuple[int, int]]:
    """(context at the start, tokens generated) for each turn."""
    ctx = spec.prompt_len
    out = []
    first = spec.response.reveal(key)
    out.append((ctx, first))
    ctx += first
    for turn in spec.later_turns.reveal(key):
        ctx += turn.observation_len
        n = turn.response.reveal(key)
        out.append((ctx, n))
        ctx += n
    return out


def oracle_bounds(specs: list[TrajectorySpec], workers: list[Worker], perfs: list[WorkerPerf], key: object, *,
                  batch_size: int = 0, eta: int = 0, train_time_s: float = 0.0) -> dict:
    segs = [_segments(s, key) for s in specs]
    tokens = sum(n for ss in segs for _c, n in ss)
    kv_tokens_read = sum((n - 1) * c + n * (n - 1) // 2 for ss in segs for c, n in ss if n > 0)
    kv_bytes = kv_tokens_read * perfs[0].kv_bytes_per_token
    min_ctx = min(s.prompt_len for s in specs) + 1
    bandwidth = 0.0
    per_token = float("inf")
    for w, p in zip(workers, perfs):
        bw = p.accel.bw_efficiency * p.accel.mem_bw_gbs * GB * p.tp
        n = max(1, min(w.max_num_seqs, w.kv_capacity // min_ctx))
        per_token = min(per_token, (p.decode_line(n, 0).base * bw + p.weight_bytes_read(n)) / n)
        bandwidth += bw
    distinct = {(p.accel.name, p.tp): p for p in perfs}.values()
    tools = [sum(t.tool_latency_s for t in s.later_turns.reveal(key)) for s in specs]
    latency = np.array([min([p.decode_alone(ss) for p in distinct]) + tool for ss, tool in zip(segs, tools)])
    terms = {"bandwidth": (kv_bytes + tokens * per_token) / bandwidth, "critical path": float(latency.max())}
    if batch_size > 0:
        batches = -(-len(specs) // batch_size)
        last = len(specs) - (batches - 1) * batch_size      # the last batch's size
        waited = max(0, batches - 1 - eta) * train_time_s
        terms["trainer"] = waited + float(np.sort(latency)[last - 1])
    binding = max(terms, key=terms.get)
    makespan = terms[binding]
    return {
        "bound_makespan_s": makespan,
        "bound_makespan_by": binding,
        "bound_throughput_tok_s": tokens / makespan if makespan > 0 else 0.0,
        "bound_latency_p50_s": float(np.percentile(latency, 50)),
        "bound_latency_p95_s": float(np.percentile(latency, 95)),
        "bound_latency_p99_s": float(np.percentile(latency, 99)),
    }


def add_bounds(result: dict, specs: list[TrajectorySpec], workers: list[Worker], perfs: list[WorkerPerf],
               key: object, scenario: Scenario) -> dict:
    """Add the oracle bounds to a run's figures, and how far the run is from them (both backends)."""
    result.update(oracle_bounds(specs, workers, perfs, key, batch_size=scenario.trainer.batch_size,
                                eta=scenario.controller.eta, train_time_s=scenario.trainer.train_time_s))
    result["throughput_fraction_of_bound"] = result["throughput_tok_s"] / result["bound_throughput_tok_s"]
    result["p95_multiple_of_bound"] = result["latency_p95_s"] / max(result["bound_latency_p95_s"], 1e-12)
    return result
