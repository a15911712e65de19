"""Every policy, on random small pools and workloads: nothing lost or duplicated, capacity and
staleness respected, the pending set empty at the end."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadencerl.config import load_scenario_dict
from cadencerl.core.actions import Evict
from cadencerl.policies import cadence as cadence_mod
from cadencerl.runs.registry import policy_names
from cadencerl.runs.simulate import simulate
from tests.conftest import sim, small

ACCELS = [("H800", 1), ("A910X", 2), ("BI-V150", 2), ("L40S", 1), ("H100", 1)]


@st.composite
def scenarios(draw, homogeneous: bool = False, multi_turn: bool = False):
    kinds = draw(st.lists(st.sampled_from(ACCELS), min_size=1, max_size=1 if homogeneous else 3, unique=True))
    pool = [{"accelerator": a, "devices": tp * draw(st.integers(1, 3)), "tp": tp,
             "max_num_seqs": draw(st.integers(2, 48))} for a, tp in kinds]
    cap = draw(st.integers(64, 4096))
    n = draw(st.integers(4, 60))
    workload = {"trajectories": n, "group_size": draw(st.integers(1, 4)),
                "prompt": {"median": draw(st.integers(16, 600)), "sigma": 0.5, "cap": 1024},
                "response": {"median": draw(st.integers(8, cap)), "sigma": draw(st.floats(0, 1.5)), "cap": cap}}
    if multi_turn:
        workload["turns"] = {"turns_min": 1, "turns_max": draw(st.integers(2, 4)),
                             "observation": {"median": 50, "sigma": 0.5, "cap": 200},
                             "tool_latency_median_s": draw(st.floats(0.01, 5.0))}
    return load_scenario_dict({
        "name": "prop", "model": "Qwen3-8B", "seed": draw(st.integers(0, 10_000)), "pool": pool,
        "workload": workload,
        "trainer": {"batch_size": draw(st.integers(2, min(24, n))), "train_time_s": draw(st.floats(0, 10))},
        "controller": {"eta": draw(st.integers(0, 3)), "tick_s": draw(st.sampled_from([0.05, 0.25, 1.0]))},
        "cadence": {"delta": draw(st.sampled_from([0, 64, 512, 2048])),
                    "headroom_floor": draw(st.sampled_from([0.0, 0.05, 0.2]))},
    })


def check(result: dict, scenario) -> None:
    n = scenario.workload.trajectories
    assert result["trajectories_completed"] == result["trajectories_submitted"] == n
    assert all(int(k) <= scenario.controller.eta for k in result["staleness_histogram"])
    assert sum(result["staleness_histogram"].values()) == n
    # the oracle bound is never beaten
    assert result["throughput_tok_s"] <= result["bound_throughput_tok_s"] * (1 + 1e-9)
    assert result["latency_p95_s"] >= result["bound_latency_p95_s"] * (1 - 1e-9)


ASYNC = [p for p in policy_names() if not p.startswith("dora")]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("policy", ASYNC)
@SETTINGS
@given(scenario=scenarios())
def test_every_policy_conserves_and_respects_bounds(policy, scenario):
    # simulate() runs the conservation check (each trajectory once, exact length, pending empty,
    # engine KV never over capacity) and the controller refuses any over-capacity placement.
    check(sim(scenario, policy), scenario)


@SETTINGS
@given(scenario=scenarios(homogeneous=True))
def test_dora_on_homogeneous_pools(scenario):
    check(sim(scenario, "dora"), scenario)


@pytest.mark.parametrize("policy", ["least-loaded", "cadence", "laminar", "areal"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(multi_turn=True))
def test_multi_turn_sessions_complete(policy, scenario):
    check(sim(scenario, policy), scenario)


@SETTINGS
@given(scenario=scenarios())
def test_concentration_never_evicts_while_pending_is_non_empty(scenario):
    check(simulate(scenario, _Guarded(scenario.cadence, scenario.controller.tick_s)), scenario)


class _Guarded(cadence_mod.Cadence):
    """CadenceRL whose concentration is checked as it goes (a subclass: a compiled policy's method
    takes no patch, and its override is what the compiled `decide` calls)."""

    def _concentrate(self, view, v, workers):
        cascade = False  # the evictions of one drain all start from an empty P_v
        for action in super()._concentrate(view, v, workers):
            if isinstance(action, Evict):
                assert cascade or view.pending.count(v) == 0, "concentration evicted past the gate"
                cascade = True
            elif cascade:
                cascade = False
            yield action


def test_a_plain_python_override_of_a_compiled_policys_step_is_the_one_run():
    """What `_Guarded` relies on, compiled or not: CadenceRL's `decide` calls a subclass's `_concentrate`."""
    class Counted(cadence_mod.Cadence):
        def _concentrate(self, view, v, workers):
            calls.append(v)
            yield from super()._concentrate(view, v, workers)

    calls: list[int] = []
    scenario = small()
    r = simulate(scenario, Counted(scenario.cadence, scenario.controller.tick_s))
    plain = sim(scenario, "cadence")
    assert calls and {k: v for k, v in r.items() if k != "wall_time_s"} == \
        {k: v for k, v in plain.items() if k != "wall_time_s"}


def test_dora_refuses_a_heterogeneous_pool():
    from cadencerl.config import ConfigError, builtin_scenario
    from cadencerl.runs.registry import make_policy

    with pytest.raises(ConfigError, match="homogeneous"):
        make_policy("dora", builtin_scenario("16a8h"))
