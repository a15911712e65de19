"""The simulated prefix cache: what leaves a running set stays cached until the weights change."""

from __future__ import annotations

from cadencerl.runs.assemble import build_pool
from cadencerl.sim.backend import SimBackend
from cadencerl.sim.prefix_cache import PrefixCache
from tests.conftest import small

KEY = object()


def test_a_released_request_is_hit_again_in_whole_blocks():
    cache = PrefixCache()
    assert cache.claim(group=1, traj=7, prompt_len=64, context=64) == 0    # a cold prompt: nothing cached
    cache.release(group=1, traj=7, prompt_len=64, context=200)
    assert cache.claim(group=1, traj=7, prompt_len=64, context=200) == 192  # prompt and history, last token computed


def test_new_weights_drop_cached_prefixes_but_not_the_blocks_of_running_requests():
    cache = PrefixCache()
    cache.claim(group=1, traj=7, prompt_len=64, context=64)
    cache.claim(group=2, traj=8, prompt_len=64, context=64)
    cache.release(group=1, traj=7, prompt_len=64, context=200)     # 8 still runs on prompt 2
    cache.drop_cached()
    assert cache.cached_tokens == 0
    assert cache.claim(group=1, traj=7, prompt_len=64, context=200) == 0      # stale: recomputed
    assert cache.claim(group=2, traj=9, prompt_len=64, context=100) == 64     # shared with a running request


def test_a_worker_taking_a_new_version_forgets_what_it_cached():
    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY)
    sim.start(workers)
    engine = sim.engines[0]
    engine.cache.release(group=1, traj=7, prompt_len=64, context=200)
    other = sim.engines[1].cache
    other.release(group=1, traj=7, prompt_len=64, context=200)
    sim.set_version(0, 1)
    assert engine.cache.cached_tokens == 0 and other.cached_tokens == 200
