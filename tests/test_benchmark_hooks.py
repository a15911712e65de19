"""The benchmarks that trace CadenceRL subclass its index and policy: an override whose parameters
drift from the method it replaces, or a default policy name the registry no longer has, breaks the
benchmark only when it runs (minutes in), so check here."""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import pytest

from cadencerl.config import builtin_scenario
from cadencerl.policies.cadence import Cadence
from cadencerl.policies.cadence_rooms import RoomIndex
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.registry import FACTORIES, make_policy
from cadencerl.sim.prefix_cache import PrefixCache

REPO = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_delta_trace_overrides_take_what_the_methods_they_replace_take():
    trace = _load("delta_trace")
    subclasses = ((trace.CountingIndex, RoomIndex), (trace.TracingCadence, Cadence), (trace.ShedAtReserve, Cadence))
    for sub, base in subclasses:
        overridden = [n for n, f in vars(sub).items() if callable(f) and n in vars(base) and not n.startswith("__")]
        assert overridden, sub
        for name in overridden:
            assert _parameters(getattr(sub, name)) == _parameters(getattr(base, name)), (sub.__name__, name)


def test_the_benchmarks_default_policies_are_registered():
    floor = _load("least_loaded_floor")
    defaults = {"floor_trace": _load("floor_trace").POLICIES.split(","),
                "least_loaded_floor": [*floor.VARIANTS.split(","), floor.FLOOR]}
    for benchmark, names in defaults.items():
        for name in names:    # a registered name, or a variant file that loads
            assert name in FACTORIES or make_policy(str(REPO / name), builtin_scenario("32a")).name, (benchmark, name)


def test_the_kv_headroom_what_if_reaches_the_simulated_workers_and_is_undone():
    """The ceiling benchmark scales KV by replacing one method: were the simulator to read the
    capacity elsewhere, it would measure the real KV twice and call it a ceiling."""
    headroom = _load("misa/kv_headroom")
    scenario = builtin_scenario("mixed-h200")
    real = [w.kv_capacity for w in build_pool(scenario)[0]]
    with headroom.scaled_kv(8):
        scaled = [w.kv_capacity for w in build_pool(scenario)[0]]
    assert scaled == [int(c * 8) for c in real] and real[0] > 0
    assert [w.kv_capacity for w in build_pool(scenario)[0]] == real


def test_the_prefixes_kept_what_if_evicts_nothing_and_is_undone():
    """The tighter ceiling keeps every cached prefix: were the what-if to miss the eviction the
    engines perform, it would measure the real pool and call it a ceiling."""
    headroom = _load("misa/kv_headroom")

    def cached_after_trim() -> int:
        cache = PrefixCache()
        cache.claim(group=1, traj=7, prompt_len=512, context=2048)
        cache.release(group=1, traj=7, prompt_len=512, context=2048)
        cache.trim(0)    # the running set has taken every free block
        return cache.cached_tokens

    with headroom.prefixes_kept():
        assert cached_after_trim() == 2048
    assert cached_after_trim() == 0


def _sim_speed(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "sim_speed.py"), "--skip-exact", *args],
                          capture_output=True, text=True, timeout=120)


def test_sim_speed_scales_the_batch_with_trajectories_as_compare_does():
    """16a16b8h's batch of 4,096 is more than 1,024 trajectories: the batch scales, not a traceback."""
    result = _sim_speed("--trajectories", "1024")
    assert result.returncode == 0, result.stderr
    assert '"trajectories": 1024' in result.stdout.splitlines()[-1]


def test_sim_speed_scale_runs_each_k_and_prints_the_exponent():
    result = _sim_speed("--scenario", "cpu-pair", "--scale", "1,2")
    assert result.returncode == 0, result.stderr
    runs = json.loads(result.stdout.splitlines()[-1])["runs"]
    assert [r["scale"] for r in runs] == [1, 2] and runs[1]["devices"] == 2 * runs[0]["devices"]
    assert runs[1]["trajectories"] == 2 * runs[0]["trajectories"] and all(r["peak_rss_mb"] > 0 for r in runs)
    assert "CPU time grows as n^" in result.stdout


@pytest.mark.parametrize("args, field", [(["--policy", "magic"], "policy"), (["--scenario", "nope"], "scenario"),
                                         (["--trajectories", "0"], "workload.trajectories")])
def test_sim_speed_bad_input_is_one_line(args, field):
    result = _sim_speed(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: {field}:") and len(result.stderr.splitlines()) == 1, result.stderr


def test_owner_cost_forwards_every_request_and_times_each_part():
    """The Rust data path's Python side on a fake `_datapath`: every ask forwarded (else it exits), each part timed."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "owner_cost.py"), "--rounds", "1",
                             "--requests", "300", "--policies", "misa+cache-aware"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.splitlines()[-1])["policies"]["misa+cache-aware"]["this tree"]
    parts = figures["us_per_request"]
    assert set(parts) == {"ask", "end", "end's pass", "total"} and all(v > 0 for v in parts.values())
    assert isinstance(figures["compiled"], bool)
