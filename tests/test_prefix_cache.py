"""The simulated prefix cache: what leaves a running set stays cached until the weights change."""

from __future__ import annotations

import pytest

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
    from cadencerl.config import ControllerSpec
    from cadencerl.core.actions import Admit, Interrupt
    from cadencerl.core.controller import Controller
    from cadencerl.core.spec import HiddenLength, TrajectorySpec
    from cadencerl.core.trajectory import Trajectory
    from cadencerl.policies.areal import AReaL

    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY)
    sim.start(workers)
    traj = Trajectory(TrajectorySpec(0, 0, 512, HiddenLength(5000, KEY)))
    ctl = Controller(AReaL(), sim, workers, [traj], batch_size=1, params=ControllerSpec(eta=1), train_time_s=1.0)
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


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("mid_prefill", [False, True])
def test_an_update_in_place_freezes_the_engine_then_resumes_its_requests_on_their_kv(exact, mid_prefill):
    """vLLM's `/pause?mode=keep`: the step in flight ends, then no decode step and no prefill chunk
    runs until the weights arrive; nothing is re-prefilled, and what the worker cached stays (that
    mode clears no cache). One request is decoding; with `mid_prefill` another has its first chunk
    in flight when the update lands."""
    from cadencerl.config import ControllerSpec
    from cadencerl.core.actions import Admit, UpdateInPlace
    from cadencerl.core.controller import Controller
    from cadencerl.core.spec import HiddenLength, TrajectorySpec
    from cadencerl.core.trajectory import Trajectory
    from cadencerl.policies.routers import CacheAware

    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY, exact=exact, weights=FixedPause(5.0))
    sim.start(workers)
    decoding = Trajectory(TrajectorySpec(0, 0, 512, HiddenLength(50_000, KEY)))
    prefilling = Trajectory(TrajectorySpec(1, 1, 30_000, HiddenLength(50_000, KEY)))
    ctl = Controller(CacheAware(version_switch="in-place"), sim, workers, [decoding, prefilling], batch_size=2,
                     params=ControllerSpec(eta=1), train_time_s=1.0)
    ctl.apply(Admit(0, 0), 0.0)
    sim.commit(0.0)
    run_until(sim, 2.0)
    sim.refresh(workers, 2.0)                                         # as the controller does before deciding
    engine = sim.engines[0]
    engine.cache.release(group=9, traj=99, prompt_len=64, context=200)   # another session's blocks
    if mid_prefill:
        ctl.apply(Admit(0, 1), 2.0)
        sim.commit(2.0)
        run_until(sim, 2.05)                                          # its first chunk's step has begun
        sim.refresh(workers, 2.05)
        assert engine.mixed_end > 2.05
    ctl.trainer.version = 1
    ctl.apply(UpdateInPlace(0, 1), sim._clock)
    sim.commit(sim._clock)                                            # the weights arrive 5 s later
    resume = sim._clock + 5.0
    request = sim._requests[0]
    run_until(sim, resume - 4.0)
    sim.refresh(workers, resume - 4.0)
    frozen_at, chunked = request.generated(), engine.prefill_tokens
    assert frozen_at > 50                                             # it had been decoding for a while
    assert chunked == 512 + (engine.perf.token_budget - 1 if mid_prefill else 0)   # the chunk in flight ended
    run_until(sim, resume - 0.1)
    sim.refresh(workers, resume - 0.1)
    assert (request.generated(), engine.prefill_tokens) == (frozen_at, chunked)   # nothing ran meanwhile
    run_until(sim, resume + 1e-3)
    if mid_prefill:                                                   # its next chunk starts as the weights land
        assert engine.mixed_end > resume and engine.seg_start == pytest.approx(resume)
    run_until(sim, resume + 8.0)
    sim.refresh(workers, resume + 8.0)
    assert sim._requests[0] is request and request.live
    assert request.generated() > frozen_at + 20                       # going on from where it stopped
    assert engine.prefill_tokens == (512 + 30_000 if mid_prefill else 512)   # each prompt once: no re-prefill
    assert engine.cache.cached_tokens >= 200
    assert decoding.versions == [0, 1] and decoding.tag == 0 and workers[0].version == 1


def test_a_request_arriving_while_the_engine_is_frozen_starts_no_prefill_before_the_weights():
    """Only a prefilling request on the worker (no running set): a new arrival during the pause
    restarts the engine, which must not start the next chunk early."""
    from cadencerl.config import ControllerSpec
    from cadencerl.core.actions import Admit, UpdateInPlace
    from cadencerl.core.controller import Controller
    from cadencerl.core.spec import HiddenLength, TrajectorySpec
    from cadencerl.core.trajectory import Trajectory
    from cadencerl.policies.routers import CacheAware

    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY, weights=FixedPause(5.0))
    sim.start(workers)
    long, late = (Trajectory(TrajectorySpec(i, i, 30_000, HiddenLength(1000, KEY))) for i in range(2))
    ctl = Controller(CacheAware(version_switch="in-place"), sim, workers, [long, late], batch_size=2,
                     params=ControllerSpec(eta=1), train_time_s=1.0)
    ctl.apply(Admit(0, 0), 0.0)
    sim.commit(0.0)                                                   # its first chunk is in flight
    ctl.trainer.version = 1
    ctl.apply(UpdateInPlace(0, 1), 0.0)
    sim.commit(0.0)
    engine = sim.engines[0]
    run_until(sim, 1.0)
    chunked = engine.prefill_tokens
    assert 0 < chunked < 30_000 and engine.mixed_end < 0              # the chunk in flight ended; frozen
    ctl.apply(Admit(0, 1), 1.0)
    sim.commit(1.0)
    run_until(sim, 4.9)
    assert engine.prefill_tokens == chunked and engine.mixed_end < 0
    run_until(sim, 5.0 + 1e-3)
    assert engine.mixed_end > 5.0                                     # chunks go on once the weights are in


@pytest.mark.parametrize("exact", [False, True])
def test_the_kv_an_engine_reports_counts_what_a_prefill_has_computed_so_far(exact):
    """vLLM's kv_cache_usage counts the blocks a prefilling request holds; MISA-T reads it as
    pressure, so the simulator reports them too: a long prompt mid-prefill on an idle engine."""
    from cadencerl.config import ControllerSpec
    from cadencerl.core.actions import Admit
    from cadencerl.core.controller import Controller
    from cadencerl.core.spec import HiddenLength, TrajectorySpec
    from cadencerl.core.trajectory import Trajectory
    from cadencerl.policies.least_loaded import LeastLoaded

    workers, perfs = build_pool(small())
    sim = SimBackend(perfs, KEY, exact=exact)
    sim.start(workers)
    long = Trajectory(TrajectorySpec(0, 0, 30_000, HiddenLength(100, KEY)))
    ctl = Controller(LeastLoaded(), sim, workers, [long], batch_size=1, params=ControllerSpec(eta=1), train_time_s=1.0)
    ctl.apply(Admit(0, 0), 0.0)
    sim.commit(0.0)
    sim.refresh(workers, 0.0)
    assert workers[0].engine_kv == 0                                  # nothing computed yet
    engine = sim.engines[0]
    budget = engine.perf.token_budget
    run_until(sim, engine.mixed_end + 1e-6)                           # the first chunk's step ended
    sim.refresh(workers, sim._clock)
    assert engine.prefilling and not engine.running
    assert workers[0].engine_kv == budget
