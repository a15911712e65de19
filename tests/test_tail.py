"""The tail split: which trajectories count as the tail, and where their time went."""

from __future__ import annotations

import pytest

from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.worker import Worker
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.tail import batch_within, best_split, decode_seconds, observed_batch, tail_breakdown
from tests.conftest import small

KEY = object()
WORKERS = [Worker(0, "A", "c", 1, 10_000, 4, 0), Worker(1, "B", "c", 1, 10_000, 4, 1)]


def _done(i: int, admitted: float, completed: float, resident: float, tokens: int, worker: int) -> Trajectory:
    t = Trajectory(TrajectorySpec(i, i, 10, HiddenLength(tokens, KEY)), state=State.DONE, tokens=tokens,
                   admitted_at=admitted, completed_at=completed, resident_time=resident, kv_home=worker)
    return t


def test_observed_batch_caps_residents_at_the_engine_and_keeps_to_the_window():
    samples = [(5.0, 0, 100.0, 2), (15.0, 0, 300.0, 6), (15.0, 1, 50.0, 1), (99.0, 0, 1.0, 50)]
    batch = observed_batch(samples, WORKERS, (10.0, 20.0))
    assert batch["A"] == {"residents": 6.0, "decode_batch": 4.0, "mean_context": 300.0,
                          "kv_full_batch": 4.0, "busy": 1.0}   # 10,000 / 300 = 33 > max_num_seqs 4
    assert batch["B"]["decode_batch"] == 1.0
    # two sample times in the whole run, worker 1 busy at one: half its time
    assert observed_batch(samples[:3], WORKERS, None)["B"]["busy"] == 0.5
    assert observed_batch(samples, WORKERS, None)["A"]["residents"] == pytest.approx((2 + 6 + 50) / 3)


def test_decode_seconds_is_tokens_times_the_step_at_that_batch():
    _workers, perfs = build_pool(small())
    perf = perfs[0]
    assert decode_seconds(perf, 100, 8.0, 1000.0) == pytest.approx(100 * perf.decode_step_time(8, 8000))
    assert decode_seconds(perf, 100, 8.0, 1000.0) > decode_seconds(perf, 100, 1.0, 1000.0)


def test_batch_within_is_the_largest_batch_that_meets_the_time():
    _workers, perfs = build_pool(small())
    perf = perfs[0]
    limit = decode_seconds(perf, 100, 8.0, 1000.0)
    assert batch_within(perf, 100, limit, 1000.0, 64) == 8
    assert batch_within(perf, 100, limit, 1000.0, 5) == 5
    assert batch_within(perf, 100, 0.5 * decode_seconds(perf, 100, 1.0, 1000.0), 1000.0, 64) == 0


def test_the_tail_is_the_slowest_in_the_window_split_into_its_parts():
    # batch 2, eta 0, 3 batches: window = [publish[0], publish[1]] = [10, 40]; batch 1 submitted at 10
    publish = [10.0, 40.0]
    trajs = [_done(0, 0.0, 8.0, 8.0, 80, 0), _done(1, 0.0, 9.0, 9.0, 90, 0),      # before the window
             _done(2, 12.0, 20.0, 8.0, 50, 0),                                     # 8 s from admission
             _done(3, 15.0, 39.0, 20.0, 100, 1),                                   # 24 s, 4 s off-worker
             _done(4, 41.0, 45.0, 4.0, 10, 0), _done(5, 41.0, 46.0, 5.0, 10, 0)]   # after the window
    order = {t.id: t.id for t in trajs}
    step = {"A": 0.1, "B": 0.15}
    adm = tail_breakdown(trajs, order, 2, 0, publish, step, WORKERS, q=60.0)
    assert adm["trajectories"] == 1 and adm["finished_on"] == {"B": 1}
    assert adm["latency_s"] == pytest.approx(24.0)
    assert adm["resident_decode_s"] == pytest.approx(15.0)
    assert adm["resident_other_s"] == pytest.approx(5.0)
    assert adm["non_resident_s"] == pytest.approx(4.0)
    assert adm["queued_before_admission_s"] == 0.0
    assert adm["length_at_percentile"] == pytest.approx(80.0)            # 60th percentile of 50, 100
    assert adm["token_share_at_or_above_it"] == pytest.approx(100 / 150)
    sub = tail_breakdown(trajs, order, 2, 0, publish, step, WORKERS, q=60.0, from_submit=True)
    assert sub["latency_s"] == pytest.approx(29.0) and sub["queued_before_admission_s"] == pytest.approx(5.0)
    assert tail_breakdown(trajs[:2], order, 2, 0, publish, step, WORKERS) == {"trajectories": 0}


def test_the_best_split_gives_the_tail_to_the_type_that_loses_least_first():
    types = {"fast": {"workers": 2, "worker_tok_s_at_cap": 50.0, "worker_tok_s_observed": 100.0},
             "big": {"workers": 1, "worker_tok_s_at_cap": 20.0, "worker_tok_s_observed": 200.0}}
    # a quarter of the tokens are tail: "fast" (loses half) serves it in part, tail = (400 - 200 f)/3
    # from 100 f = (400 - 200 f) / 3  ->  f = 0.8, tail 80 tok/s, total 320
    assert best_split(types, 0.25) == pytest.approx(320.0)
    # all of "fast" is not enough for a 60% tail: "big" gives f of itself, 100 + 20 f = 1.5 (200 - 200 f)
    assert best_split(types, 0.6) == pytest.approx((100.0 + 20.0 * 0.625) / 0.6)
    assert best_split(types, 0.0) == 0.0
    assert best_split({"slow": {"workers": 4, "worker_tok_s_at_cap": 0.0, "worker_tok_s_observed": 10.0}}, 0.2) == 0.0
