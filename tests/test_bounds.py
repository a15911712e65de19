"""The physical bound: hand-computed on tiny cases, and never beaten by any policy."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadencerl.config import load_scenario_dict
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.hardware import catalog
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.bounds import oracle_bounds
from tests.conftest import sim, small

KEY = object()
KVB = 144 * 1024
W = 8.2e9 * 2
BW = 0.7 * 3350e9


def one_h800():
    s = load_scenario_dict({"name": "t", "model": "Qwen3-8B", "pool": [{"accelerator": "H800", "devices": 1}],
                            "workload": {"trajectories": 1, "response": {"median": 10, "cap": 100}},
                            "trainer": {"batch_size": 1}})
    return build_pool(s)


def alone(ctx: int, n: int) -> float:
    """Batch-1 decode on the H800 of every token but the first (which comes with the prefill)."""
    return sum(0.005 + (W + c * KVB) / BW for c in range(ctx + 1, ctx + n))


def test_a_single_trajectory_is_bound_by_its_critical_path():
    workers, perfs = one_h800()
    b = oracle_bounds([TrajectorySpec(0, 0, 100, HiddenLength(50, KEY))], workers, perfs, KEY)
    assert b["bound_makespan_by"] == "critical path"
    assert b["bound_makespan_s"] == pytest.approx(alone(100, 50))
    assert b["bound_throughput_tok_s"] == pytest.approx(50 / alone(100, 50))
    assert b["bound_latency_p95_s"] == pytest.approx(alone(100, 50))


def test_many_trajectories_are_bound_by_bandwidth_and_step_overhead():
    workers, perfs = one_h800()
    specs = [TrajectorySpec(i, i, 100, HiddenLength(50, KEY)) for i in range(5000)]
    b = oracle_bounds(specs, workers, perfs, KEY)
    n = min(256, workers[0].kv_capacity // 101)            # the largest batch the KV allows
    per_token = (0.005 * BW + W) / n                       # step overhead and weights, shared by the batch
    kv_bytes = 5000 * KVB * sum(range(101, 150))          # contexts 101..149 (the first token comes with prefill)
    assert b["bound_makespan_by"] == "bandwidth"
    assert b["bound_makespan_s"] == pytest.approx((kv_bytes + 5000 * 50 * per_token) / BW)


def test_the_trainer_chain_under_eta_binds_when_training_is_slow():
    workers, perfs = one_h800()
    specs = [TrajectorySpec(i, i, 100, HiddenLength(50, KEY)) for i in range(4)]
    b = oracle_bounds(specs, workers, perfs, KEY, batch_size=1, eta=0, train_time_s=100.0)
    # batch 3 holds a trajectory tagged 3, which starts after three trainings
    assert b["bound_makespan_by"] == "trainer"
    assert b["bound_makespan_s"] == pytest.approx(300.0 + alone(100, 50))


def test_latency_bound_uses_the_fastest_worker_type():
    s = load_scenario_dict({"name": "t", "model": "Qwen3-8B",
                            "pool": [{"accelerator": "L40S", "devices": 1}, {"accelerator": "H200", "devices": 1}],
                            "workload": {"trajectories": 1, "response": {"median": 10, "cap": 100}},
                            "trainer": {"batch_size": 1}})
    workers, perfs = build_pool(s)
    b = oracle_bounds([TrajectorySpec(0, 0, 10, HiddenLength(20, KEY))], workers, perfs, KEY)
    h200 = next(p for p in perfs if p.accel.name == "H200")
    assert b["bound_latency_p50_s"] == pytest.approx(h200.decode_line(1, 11).time(19))
    bw = sum(a.bw_efficiency * a.mem_bw_gbs * 1e9 for a in (catalog.ACCELERATORS["L40S"], catalog.ACCELERATORS["H200"]))
    assert b["bound_throughput_tok_s"] < bw / (144 * 1024 * 10)  # never more than the KV alone allows


@pytest.mark.timeout(300)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pool=st.sampled_from(["16a16b8h", "h800-16", "32b", "16a8h", "cpu-pair"]),
       policy=st.sampled_from(["cadence", "sync", "one-off", "laminar", "areal", "least-loaded"]),
       n=st.integers(32, 160), cap=st.sampled_from([512, 2048, 4096]), eta=st.integers(0, 2))
def test_no_policy_run_beats_the_bound(pool, policy, n, cap, eta):
    r = sim(small(pool, trajectories=n, batch=16, cap=cap, eta=eta), policy)
    assert r["sim_time_s"] >= r["bound_makespan_s"] * (1 - 1e-9)
    assert r["throughput_tok_s"] <= r["bound_throughput_tok_s"] * (1 + 1e-9)
    for q in ("p50", "p95", "p99"):
        assert r[f"latency_{q}_s"] >= r[f"bound_latency_{q}_s"] * (1 - 1e-9)
