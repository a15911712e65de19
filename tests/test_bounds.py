"""The physical bound: hand-computed on tiny cases, and never beaten by any policy."""

import pytest

from cadencerl.runs.bounds import oracle_bounds
from cadencerl.config import load_scenario_dict
from cadencerl.hardware import catalog
from cadencerl.runs.assemble import build_pool
from cadencerl.core.spec import HiddenLength, TrajectorySpec

KEY = object()


def one_h800():
    s = load_scenario_dict({"name": "t", "model": "Qwen3-8B", "pool": [{"accelerator": "H800", "devices": 1}],
                            "workload": {"trajectories": 1, "response": {"median": 10, "cap": 100}},
                            "trainer": {"batch_size": 1}})
    return build_pool(s)


def test_single_trajectory_bound_by_hand():
    workers, perfs = one_h800()
    spec = TrajectorySpec(0, 0, 100, HiddenLength(50, KEY))
    b = oracle_bounds([spec], workers, perfs, KEY)
    kvb = 144 * 1024
    kv_bytes = kvb * (50 * 100 + 50 * 49 // 2)          # contexts 100..149
    n = min(256, workers[0].kv_capacity // 101)           # the largest batch the KV allows
    weight_per_token = 8.2e9 * 2 / n
    bw = 0.7 * 3350e9
    assert b["bound_throughput_tok_s"] == pytest.approx(50 / ((kv_bytes + 50 * weight_per_token) / bw))
    # alone on the H800: 50 steps of t0 + (weights + context) / bandwidth
    alone = sum(0.005 + (8.2e9 * 2 + (100 + k) * kvb) / bw for k in range(50))
    assert b["bound_latency_p95_s"] == pytest.approx(alone)


def test_latency_bound_uses_the_fastest_worker_type():
    s = load_scenario_dict({"name": "t", "model": "Qwen3-8B",
                            "pool": [{"accelerator": "L40S", "devices": 1}, {"accelerator": "H200", "devices": 1}],
                            "workload": {"trajectories": 1, "response": {"median": 10, "cap": 100}},
                            "trainer": {"batch_size": 1}})
    workers, perfs = build_pool(s)
    spec = TrajectorySpec(0, 0, 10, HiddenLength(20, KEY))
    b = oracle_bounds([spec], workers, perfs, KEY)
    h200 = next(p for p in perfs if p.accel.name == "H200")
    assert b["bound_latency_p50_s"] == pytest.approx(h200.decode_line(1, 10).time(20))
    bw = sum(a.bw_efficiency * a.mem_bw_gbs * 1e9 for a in (catalog.ACCELERATORS["L40S"], catalog.ACCELERATORS["H200"]))
    assert b["bound_throughput_tok_s"] < bw / (144 * 1024 * 10)  # never more than the KV alone allows
