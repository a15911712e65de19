"""Steady-state figures: the window, submission times, tokens decoded in the window."""

from __future__ import annotations

import pytest

from cadencerl.config import builtin_scenario
from cadencerl.runs.steady import steady_view, steady_window, submitted_at, tokens_between
from tests.conftest import sim


def test_the_window_leaves_out_the_first_and_the_last_iteration():
    publish = [10.0, 20.0, 30.0, 40.0]          # versions 1..4 of 5 batches (the 5th is never published)
    assert steady_window(publish, 5) == (10.0, 40.0)
    assert steady_window(publish + [50.0], 5) == (10.0, 40.0)
    assert steady_window([10.0], 2) is None      # two iterations: nothing in between


def test_submission_follows_the_eta_budget():
    publish = [10.0, 20.0, 30.0]
    # batch 4, eta 1: batches 0 and 1 are available at once, batch 2 once version 1 is out, ...
    assert [submitted_at(i, 4, 1, publish) for i in (0, 7, 8, 12, 16)] == [0.0, 0.0, 10.0, 20.0, 30.0]
    assert submitted_at(8, 4, 0, publish) == 20.0  # eta 0: batch 2 waits for version 2


def test_tokens_between_interpolates_cumulative_samples():
    samples = [(0.0, 0), (10.0, 1000), (20.0, 3000)]
    assert tokens_between(samples, 5.0, 15.0) == pytest.approx(1500.0)
    assert tokens_between(samples, 0.0, 30.0) == pytest.approx(3000.0)


def test_the_steady_view_swaps_in_the_window_and_keeps_the_run():
    run = {"steady_window_s": [1.0, 2.0], "bound_throughput_tok_s": 200.0, "bound_latency_p95_s": 5.0}
    keys = ("throughput_tok_s", "latency_p50_s", "latency_p95_s", "latency_p99_s", "latency_from_submit_p50_s",
            "latency_from_submit_p95_s", "non_resident_p50", "non_resident_p95")
    for i, k in enumerate(keys):
        run[k], run["steady_" + k] = float(i), 100.0 + i
    view = steady_view(run)
    assert view["throughput_tok_s"] == 100.0 and view["run_throughput_tok_s"] == 0.0
    assert view["throughput_fraction_of_bound"] == 0.5 and view["p95_multiple_of_bound"] == pytest.approx(102 / 5)
    assert steady_view({"steady_window_s": None, "throughput_tok_s": 1.0}) == {"steady_window_s": None,
                                                                              "throughput_tok_s": 1.0}


@pytest.mark.parametrize("name, trajectories", [("16a16b8h", 509), ("16a16b8h", 777), ("mixed-16a8h", 512),
                                                ("mixed-h200", 301)])
def test_a_resized_run_keeps_the_scenarios_number_of_batches(name, trajectories):
    """`--trajectories N` scaled the batch by rounding: 509 on 16a16b8h gave batches of 127 and a fifth
    batch of 1, whose iteration then sat in the steady window."""
    s = builtin_scenario(name)
    batches = -(-s.workload.trajectories // s.trainer.batch_size)
    r = s.resized(trajectories)
    assert -(-trajectories // r.trainer.batch_size) == batches
    assert trajectories - (batches - 1) * r.trainer.batch_size <= r.trainer.batch_size


def test_the_window_ends_with_the_pools_work_where_the_trainer_is_slower():
    """On a small mixed run the trainer publishes version n-1 after the last completion: the window
    ended there, taking in the trainer's time with an idle pool (steady 20% under the whole run)."""
    s = builtin_scenario("mixed-16a8h").resized(256)
    r = sim(s, "misa+cadence")
    start, end = r["steady_window_s"]
    assert start < end <= r["sim_time_s"]
