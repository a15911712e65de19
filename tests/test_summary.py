"""A run's summary reads one typed per-engine input that both backends provide, and the oracle
ratios are added the same way for both."""

from __future__ import annotations

import pytest

from cadencerl.core.backend import EngineFigures, PrefixCounts
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.engine.backend import WorkerRecord
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.bounds import add_bounds, oracle_bounds
from cadencerl.sim.backend import SimBackend
from tests.conftest import small

KEY = object()


def test_both_backends_report_engine_figures():
    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY)
    sim.start(workers)
    real = WorkerRecord(0, "http://127.0.0.1:8000", 1000, 1000)
    for engine in (*sim.engines, real):
        assert isinstance(engine, EngineFigures)
        assert isinstance(engine.cache, PrefixCounts)


def test_add_bounds_gives_the_ratios_to_the_oracle():
    workers, perfs = build_pool(small())
    specs = [TrajectorySpec(i, i, 100, HiddenLength(50 + i, KEY)) for i in range(8)]
    scenario = small()
    bounds = oracle_bounds(specs, workers, perfs, KEY, batch_size=scenario.trainer.batch_size,
                           eta=scenario.controller.eta, train_time_s=scenario.trainer.train_time_s)
    result = add_bounds({"throughput_tok_s": 1000.0, "latency_p95_s": 30.0}, specs, workers, perfs, KEY, scenario)
    assert result["bound_throughput_tok_s"] == bounds["bound_throughput_tok_s"]
    assert result["throughput_fraction_of_bound"] == pytest.approx(1000.0 / bounds["bound_throughput_tok_s"])
    assert result["p95_multiple_of_bound"] == pytest.approx(30.0 / bounds["bound_latency_p95_s"])
