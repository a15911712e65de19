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


def run_until(sim: SimBackend, t: float) -> None:
    """Run the engines to `t` (one `advance` stops at the first instant with events)."""
    while sim._clock < t:
        sim.advance(t)


class FixedPause:
    """Weights that reach every worker `pause_s` after it takes them."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s

    def ready_at(self, worker: int, version: int, now: float) -> float:
        return now + self.pause_s

    def publish(self, now: float) -> None:
        pass


def test_an_update_in_place_freezes_the_running_request_then_resumes_it_on_its_kv():
    """vLLM's `/pause?mode=keep`: no step runs until the weights arrive, nothing is re-prefilled,
    and what the worker cached stays (that mode clears no cache)."""
    from cadencerl.config import PolicySpec
    from cadencerl.core.actions import Admit, UpdateInPlace
    from cadencerl.core.controller import Controller
    from cadencerl.core.spec import HiddenLength, TrajectorySpec
    from cadencerl.core.trajectory import Trajectory
    from cadencerl.routing.routers import CacheAware

    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY, weights=FixedPause(5.0))
    sim.start(workers)
    traj = Trajectory(TrajectorySpec(0, 0, 512, HiddenLength(50_000, KEY)))
    ctl = Controller(CacheAware(weight_update="in-place"), sim, workers, [traj], batch_size=1,
                     params=PolicySpec(eta=1), train_time_s=1.0)
    ctl.apply(Admit(0, 0), 0.0)
    sim.commit(0.0)
    run_until(sim, 2.0)
    sim.sync(2.0)                                                     # as the controller does before deciding
    engine = sim.engines[0]
    engine.cache.release(group=9, traj=99, prompt_len=64, context=200)   # another session's blocks
    request = sim._requests[0]
    ctl.trainer.version = 1
    ctl.apply(UpdateInPlace(0, 1), 2.0)
    sim.commit(2.0)
    frozen_at = request.generated()
    prefilled = engine.prefill_tokens
    assert frozen_at > 50                                             # it had been decoding for a while
    run_until(sim, 6.9)
    engine.sync(6.9)
    assert request.generated() + engine.lag == frozen_at            # no step while the weights travel
    run_until(sim, 9.0)
    engine.sync(9.0)
    assert sim._requests[0] is request and request.live
    assert request.generated() + engine.lag > frozen_at + 50         # going on from where it stopped
    assert engine.prefill_tokens == prefilled                         # on the KV it held: no re-prefill
    assert engine.cache.cached_tokens >= 200
    assert traj.versions == [0, 1] and traj.tag == 0 and workers[0].version == 1
