"""Property: a scenario either is refused with one line naming a field, or runs to completion.

Hypothesis draws scenario dictionaries over the whole schema, small in size (few trajectories and
devices) but over the full accepted range of every knob and duration, with wild values (inf, NaN,
negative, huge, booleans, strings) mixed in. Whatever validates must finish within a wall-time
bound with nothing lost; whatever does not must say so in one line.
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cadencerl.config import MAX_SECONDS, MAX_SIGMA, ConfigError, load_scenario_dict
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate

pytestmark = pytest.mark.timeout(600)
WALL_BOUND_S = 60.0
WILD = st.sampled_from([math.inf, -math.inf, math.nan, -1, 0, 10**30, True, "7", None, [], {}])
ACCELS = [("H800", 1), ("A910X", 2), ("BI-V150", 2), ("L40S", 1), ("H100", 1)]
POLICIES = ["cadence", "laminar", "areal", "least-loaded", "sync", "round-robin", "misa+cache-aware"]


def maybe(draw, valid: st.SearchStrategy):
    """A valid value, or in a wild example (half of them) a wild one one time in ten."""
    if draw(st.shared(st.booleans(), key="wild")) and draw(st.integers(0, 9)) == 0:
        return draw(WILD)
    return draw(valid)


def length(draw, cap_max: int) -> dict:
    cap = maybe(draw, st.integers(1, cap_max))
    top = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else 10
    return {"median": maybe(draw, st.floats(0.5, min(top, cap_max))), "sigma": maybe(draw, st.floats(0, MAX_SIGMA)),
            "cap": cap, "minimum": maybe(draw, st.integers(1, max(1, min(top, 8))))}


@st.composite
def scenario_dicts(draw) -> dict:
    kinds = draw(st.lists(st.sampled_from(ACCELS), min_size=1, max_size=3, unique=True))
    pool = [{"accelerator": a, "devices": maybe(draw, st.integers(1, 2).map(lambda k, tp=tp: k * tp)), "tp": tp,
             "max_num_seqs": maybe(draw, st.integers(1, 64))} for a, tp in kinds]
    n = maybe(draw, st.integers(1, 24))
    workload: dict = {"trajectories": n, "group_size": maybe(draw, st.integers(1, 6)),
                      "prompt": length(draw, 512), "prompt_difficulty_sigma": maybe(draw, st.floats(0, MAX_SIGMA))}
    if draw(st.booleans()):
        workload["response"] = length(draw, 2048)
    else:
        workload["classes"] = {name: {"share": maybe(draw, st.floats(1e-3, 1e6)), "response": length(draw, 1024)}
                               for name in draw(st.lists(st.sampled_from(["a", "b", "ü"]), min_size=1, unique=True))}
    if draw(st.booleans()):
        workload["turns"] = {"turns_min": maybe(draw, st.integers(1, 3)), "turns_max": maybe(draw, st.integers(1, 4)),
                             "observation": length(draw, 256),
                             "tool_latency_median_s": maybe(draw, st.floats(0, MAX_SECONDS)),
                             "tool_latency_sigma": maybe(draw, st.floats(0, MAX_SIGMA))}
    batch_top = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 4
    return {
        "name": draw(st.sampled_from(["prop", "démo π", "a b-c_d"])), "model": "Qwen3-8B",
        "seed": maybe(draw, st.integers(0, 2**32)), "pool": pool, "workload": workload,
        "trainer": {"batch_size": maybe(draw, st.integers(1, batch_top)),
                    "train_time_s": maybe(draw, st.floats(0, MAX_SECONDS)),
                    "train_time_per_token_s": maybe(draw, st.floats(0, 1e-3))},
        "controller": {"eta": maybe(draw, st.integers(0, 4)), "tick_s": maybe(draw, st.floats(0.01, 3600))},
        "cadence": {"delta": maybe(draw, st.integers(0, 1 << 24)), "headroom_floor": maybe(draw, st.floats(0, 0.9))},
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=scenario_dicts(), policy=st.sampled_from(POLICIES))
def test_a_scenario_is_refused_in_one_line_or_runs_to_completion(data, policy):
    try:
        scenario = load_scenario_dict(data)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and ": " in message, message
        event("refused")
        return
    started = time.monotonic()
    try:
        result = simulate(scenario, make_policy(policy, scenario))
    except ConfigError as exc:      # refused up front: a trajectory (or a prompt plus delta) fits no worker
        event("does not fit")
        assert "\n" not in str(exc) and str(exc).startswith(("workload", "cadence.delta")), str(exc)
        return
    event("ran")
    assert result["trajectories_completed"] == scenario.workload.trajectories
    assert time.monotonic() - started < WALL_BOUND_S


@pytest.mark.parametrize("policy", ["cadence", "least-loaded", "sync", "misa+cache-aware"])
def test_idle_virtual_time_costs_no_decisions(policy):
    """A day of training per batch and the finest tick: the controller jumps over the idle time, so
    the number of decisions follows the events, not virtual time / tick_s (8.6 million ticks here)."""
    scenario = load_scenario_dict({
        "name": "idle", "model": "Qwen3-8B", "pool": [{"accelerator": "H800", "devices": 2}],
        "workload": {"trajectories": 16, "group_size": 4, "response": {"median": 300, "cap": 2000},
                     "turns": {"turns_min": 2, "turns_max": 3, "tool_latency_median_s": MAX_SECONDS,
                               "tool_latency_sigma": 0.0}},
        "trainer": {"batch_size": 8, "train_time_s": MAX_SECONDS},
        "controller": {"tick_s": 0.01}})
    result = simulate(scenario, make_policy(policy, scenario))
    assert result["trajectories_completed"] == 16
    assert result["sim_time_s"] > MAX_SECONDS
    assert result["decisions"] < 20_000
