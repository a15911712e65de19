"""The report's matrix: --quick keeps the full report's KV pressure on a quarter of each pool."""

from __future__ import annotations

from cadencerl.config import builtin_scenario
from cadencerl.report.matrix import (DETAIL_POOL, HETEROGENEOUS_POOLS, LIGHT_BATCH, light_scenario, make_settings,
                                     pool_scenario, reference_pools)
from cadencerl.runs.assemble import build_pool


def test_quick_runs_each_pool_at_a_quarter_of_its_devices_and_batch_so_each_worker_carries_the_same_load():
    quick = make_settings(quick=True)
    for name in HETEROGENEOUS_POOLS:
        full, small = builtin_scenario(name), pool_scenario(name, quick)
        workers_full, _ = build_pool(full)
        workers_small, _ = build_pool(small)
        assert len(workers_small) * 4 == len(workers_full)
        assert small.trainer.batch_size * 4 == full.trainer.batch_size
        # the same types, in the same proportions, with the same KV each: the same pressure per worker
        assert sorted((w.accelerator, w.kv_capacity, w.rank) for w in workers_small) == \
            sorted((w.accelerator, w.kv_capacity, w.rank) for w in workers_full)[::4]


def test_the_light_load_table_runs_the_whole_pools_at_a_light_batch():
    s = light_scenario("16a16b8h", make_settings(quick=True))
    assert s.pool == builtin_scenario("16a16b8h").pool and s.trainer.batch_size == LIGHT_BATCH


def test_quick_runs_the_clairvoyant_reference_on_the_detail_pool_alone():
    assert [s.name for s in reference_pools(make_settings(quick=True))] == [DETAIL_POOL]
    assert len(reference_pools(make_settings())) > 1
