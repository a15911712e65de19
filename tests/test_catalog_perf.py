import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadencerl.hardware import catalog
from cadencerl.hardware.perf import DecodeLine, DoesNotFitError, make_perf
from cadencerl.sim.links import Links


@pytest.mark.parametrize("entry", [*catalog.ACCELERATORS.values(), *catalog.MODELS.values(), *catalog.LINKS.values()],
                         ids=lambda e: e.name)
def test_every_number_has_a_source(entry):
    for name in catalog.numeric_fields(entry):
        src = entry.sources.get(name) or entry.sources.get("*")
        assert src and len(src) > 5, f"{entry.name}.{name} has no source"


def test_catalog_has_the_required_entries():
    for name in ("H800", "H100", "H200", "A100", "A800", "L40S", "MI300X", "A910X", "BI-V150"):
        assert name in catalog.ACCELERATORS
    for name in ("Qwen3-8B", "Qwen3-14B", "Qwen3-32B", "Qwen3-30B-A3B"):
        assert name in catalog.MODELS


def test_kv_bytes_per_token_matches_reference():
    # reference/hardware.md: 144 KiB, 160 KiB, 256 KiB, 96 KiB
    assert catalog.MODELS["Qwen3-8B"].kv_bytes_per_token == 144 * 1024
    assert catalog.MODELS["Qwen3-14B"].kv_bytes_per_token == 160 * 1024
    assert catalog.MODELS["Qwen3-32B"].kv_bytes_per_token == 256 * 1024
    assert catalog.MODELS["Qwen3-30B-A3B"].kv_bytes_per_token == 96 * 1024


def test_kv_capacity_is_hbm_minus_weights_over_kv_bytes():
    a, m = catalog.ACCELERATORS["H800"], catalog.MODELS["Qwen3-8B"]
    perf = make_perf(a, m, 1)
    free = (80 * 0.9 - 2.0) * 1e9 - 8.2e9 * 2
    assert perf.kv_capacity_tokens() == int(free // (144 * 1024))


def test_model_that_does_not_fit_is_an_error():
    with pytest.raises(DoesNotFitError, match="does not fit"):
        make_perf(catalog.ACCELERATORS["BI-V150"], catalog.MODELS["Qwen3-32B"], 2)


def test_decode_is_bandwidth_bound_and_grows_with_context():
    perf = make_perf(catalog.ACCELERATORS["H800"], catalog.MODELS["Qwen3-8B"], 1)
    t_small = perf.decode_step_time(1, 1_000)
    t_long = perf.decode_step_time(1, 100_000)
    assert t_long > t_small
    # weights read once per step: batch 64 costs far less than 64x batch 1
    assert perf.decode_step_time(64, 64_000) < 8 * perf.decode_step_time(1, 1_000)
    # memory-bound lower bound: at least the weight bytes over peak bandwidth
    assert t_small > 16.4e9 / 3.35e12


def test_moe_reads_more_experts_with_larger_batches():
    perf = make_perf(catalog.ACCELERATORS["H200"], catalog.MODELS["Qwen3-30B-A3B"], 1)
    assert perf.weight_bytes_read(1) < perf.weight_bytes_read(8) < perf.weight_bytes_read(256)
    assert perf.weight_bytes_read(10_000) == pytest.approx(catalog.MODELS["Qwen3-30B-A3B"].weight_bytes, rel=1e-6)


def test_prefill_and_transfer_costs():
    perf = make_perf(catalog.ACCELERATORS["H800"], catalog.MODELS["Qwen3-8B"], 1)
    # reference estimate: ~1.7 s to re-prefill 32K tokens of Qwen3-8B on an H800 at ~50% MFU
    assert 1.0 < perf.prefill_time([32768]) < 2.5
    # 4.8 GB over 20 Gbps is ~1.9 s on an idle link (the simulator's queue); intra-cluster RDMA is much faster
    nbytes = 32768 * perf.model.kv_bytes_per_token
    cross, intra = (Links().get(name, catalog.LINKS[name]).finish(0.0, nbytes)
                    for name in ("cross-cluster", "intra-cluster"))
    assert 1.5 < cross < 2.5 and intra < cross / 5


lines = st.builds(DecodeLine, st.floats(1e-4, 1e-2), st.floats(0, 0.05), st.floats(0, 1e-4),
                  st.floats(0, 0.05), st.floats(0, 1e-4))


@settings(max_examples=200, deadline=None)
@given(line=lines, n=st.integers(0, 3000))
def test_closed_form_time_equals_the_sum_of_steps(line, n):
    assert math.isclose(line.time(n), sum(line.step(k) for k in range(n)), rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(line=lines, budget=st.floats(0, 50), limit=st.integers(0, 5000))
def test_steps_within_is_the_inverse_of_time(line, budget, limit):
    n = line.steps_within(budget, limit)
    assert 0 <= n <= limit
    assert line.time(n) <= budget + 1e-9
    if n < limit:
        assert line.time(n + 1) > budget - 1e-9
