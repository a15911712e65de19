"""The clairvoyant reference: an explicitly named oracle, reachable only through runs/reference.py."""

import pytest

from cadencerl.config import ConfigError
from cadencerl.core.spec import PeekError
from cadencerl.policies.oracle import Clairvoyant
from cadencerl.runs import registry
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.reference import clairvoyant_reference, distance, with_reference
from cadencerl.workload.generate import generate
from tests.conftest import sim, small

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("pool", ["16a16b8h", "h800-16", "cpu-pair"])
def test_the_reference_completes_everything_within_the_bound(pool):
    s = small(pool, trajectories=160, batch=40)
    r = clairvoyant_reference(s)
    assert r["policy"] == "oracle"
    assert r["trajectories_completed"] == 160
    assert r["throughput_tok_s"] <= r["bound_throughput_tok_s"]
    assert r["latency_p95_s"] >= r["bound_latency_p95_s"]


def test_it_needs_the_key_it_was_handed():
    s = small("16a8h", trajectories=64, batch=16)
    _workers, perfs = build_pool(s)
    with pytest.raises(PeekError):
        Clairvoyant(object(), generate(s.workload, s.seed, object()), perfs)


def test_no_policy_name_resolves_to_it():
    with pytest.raises(ConfigError):
        registry.make_policy("oracle", small())


def test_every_run_gets_its_distance_from_bound_and_reference():
    s = small("16a16b8h", trajectories=96, batch=32)
    runs = [sim(s, "cadence"), sim(s, "sync")]
    ref = with_reference(runs, s)
    for r in runs:
        assert r["throughput_fraction_of_reference"] == pytest.approx(r["throughput_tok_s"] / ref["throughput_tok_s"])
        assert r["p95_multiple_of_reference"] == pytest.approx(r["latency_p95_s"] / ref["latency_p95_s"])
        assert 0 < r["throughput_fraction_of_bound"] <= 1
    assert distance(ref, ref)["throughput_fraction_of_reference"] == 1.0
