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


def test_new_weights_drop_every_cached_prefix():
    cache = PrefixCache()
    cache.claim(group=1, traj=7, prompt_len=64, context=64)
    cache.release(group=1, traj=7, prompt_len=64, context=200)
    cache.drop_cached()
    assert cache.cached_tokens == 0 and not cache.lru
    assert cache.claim(group=1, traj=7, prompt_len=64, context=200) == 0      # stale: recomputed


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


def test_an_interrupted_request_re_prefills_its_whole_context_under_the_new_weights():
    """The controller evicts, then moves the worker, then re-places: the blocks the eviction cached
    are gone before the request comes back, so none of its context is a hit."""
    from cadencerl.config import PolicySpec
    from cadencerl.core.actions import Admit, Interrupt
    from cadencerl.core.controller import Controller
    from cadencerl.core.spec import HiddenLength, TrajectorySpec
    from cadencerl.core.trajectory import Trajectory
    from cadencerl.policies.areal import AReaL

    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY)
    sim.start(workers)
    traj = Trajectory(TrajectorySpec(0, 0, 512, HiddenLength(5000, KEY)))
    ctl = Controller(AReaL(), sim, workers, [traj], batch_size=1, params=PolicySpec(eta=1), train_time_s=1.0)
    ctl.apply(Admit(0, 0), 0.0)
    sim.commit(0.0)
    sim.advance(2.0)
    engine = sim.engines[0]
    engine.sync(2.0)
    hits = engine.cache.hits
    ctl.trainer.version = 1
    ctl.apply(Interrupt(0, 1), 2.0)
    sim.commit(2.0)
    request = sim._requests[0]
    assert traj.context > 512 and request.ctx0 == traj.context
    assert engine.cache.hits == hits and request.done == 0   # nothing of it was found cached
