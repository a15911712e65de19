"""The goodput climber on MISA-T's KV bands (`misa-goodput`): one rule at a time on hand-built
figures and views: the step direction, one step an iteration, the bounds, the goodput count, and
the bands the boost moves."""

from __future__ import annotations

import pytest

from cadencerl.admission.misa import DECREASE, HIGH, MisaT
from cadencerl.admission.misa_goodput import DEADBAND, MAX_BOOST, STEP, GoodputClimb, next_direction
from cadencerl.admission.misa_learn import WARMUP, ClassStats, Learner
from cadencerl.core.trajectory import State
from cadencerl.policies.least_loaded import LeastLoaded
from tests.pools import pool, traj, worker


def test_a_step_that_raised_goodput_is_kept_and_one_that_lowered_it_is_reversed():
    assert next_direction(1, 1.3, 100.0, 110.0) == 1
    assert next_direction(-1, 1.3, 100.0, 110.0) == -1
    assert next_direction(1, 1.3, 100.0, 90.0) == -1
    assert next_direction(-1, 1.3, 100.0, 90.0) == 1


def test_a_flat_reading_leans_back_toward_holding_kv_and_boost_one_probes_up():
    flat = 100.0 * (1 + DEADBAND / 2)
    assert next_direction(1, 1.3, 100.0, flat) == -1
    assert next_direction(-1, 1.0, 100.0, 50.0) == 1      # at the floor: the only way to learn is up


def test_the_climber_steps_once_an_iteration_and_skips_the_first():
    climb = GoodputClimb()
    assert climb.look(0.0, 0, version=0) == 1.0
    assert climb.look(50.0, 500_000, version=0) == 1.0       # no publish: no step
    assert climb.look(100.0, 1_000_000, version=1) == 1.0    # first publish: starts the measurement
    assert climb.look(150.0, 1_500_000, version=1) == 1.0
    assert climb.look(200.0, 2_000_000, version=2) == pytest.approx(STEP)   # 10,000 tok/s measured
    assert climb.last_rate == pytest.approx(10_000)
    assert climb.look(300.0, 3_500_000, version=3) == pytest.approx(STEP ** 2)   # 15,000: rose, keep
    assert climb.look(400.0, 4_000_000, version=4) == pytest.approx(STEP)        # 5,000: fell, reverse


def test_the_boost_stays_between_one_and_max_boost():
    climb = GoodputClimb()
    climb.look(0.0, 0, version=1)
    tokens = 0
    for v in range(2, 40):                 # goodput rises every iteration: it climbs to the bound
        tokens += 1000 * v * 100
        climb.look(100.0 * v, tokens, version=v)
        assert 1.0 <= climb.boost <= MAX_BOOST
    assert climb.boost == pytest.approx(MAX_BOOST)


def test_goodput_counts_each_streamed_token_of_a_tracked_session_once_finished_ones_included():
    learner = Learner()
    a, b = traj(1, 110), traj(2, 60)      # 100 and 50 tokens generated (prompt 10)
    learner.track(a)
    learner.track(b)
    learner.learn(1.0)
    assert learner.decoded == 150
    a.tokens += 30
    b.tokens += 20
    b.state, b.completed_at, b.admitted_at = State.DONE, 2.0, 0.0
    learner.learn(2.0)
    assert learner.decoded == 200
    learner.learn(3.0)
    assert learner.decoded == 200         # nothing new streamed, the finished session is gone


def test_a_boost_moves_the_kv_bands_and_the_capacity_estimate_with_it():
    """At boost 1, 95% KV use is pressure; at a boost the climber chose, the cap is the boosted
    estimate and only use above HIGH x boost (or preemptions, or a queue) shrinks it."""
    def capped(boost):
        misa = MisaT({"rlvr": 1.0})
        misa.learner.stats["rlvr"] = ClassStats(500, 10, WARMUP)
        misa.boost = boost
        w = worker(0, cap=10_000, residents=[traj(i, 10) for i in range(100, 110)])
        misa.observe(pool(LeastLoaded(), [w]).view)
        first = misa.caps[0]
        w.engine_kv = 9_500
        p = pool(LeastLoaded(), [w])
        p.now = 1.0
        misa.observe(p.view)
        return first, misa.caps[0]
    first, after = capped(1.0)
    assert after == pytest.approx(DECREASE * 10)            # pressure: down to DECREASE of those in flight
    first_boosted, after_boosted = capped(1.2)
    assert first_boosted == pytest.approx(1.2 * first)
    assert 0.95 < 1.2 * HIGH and after_boosted == pytest.approx(first_boosted)   # 95% is under 1.2 x HIGH


def test_a_probe_that_did_not_pay_holds_boost_one_for_doubling_iterations():
    climb = GoodputClimb()
    climb.look(0.0, 0, version=1)
    t, tokens, boosts = 0.0, 0, []
    for v in range(2, 12):              # goodput falls whenever the boost is up: every probe fails
        t += 100.0
        tokens += 1_000_000 if climb.boost <= 1.0 else 900_000
        boosts.append(climb.look(t, tokens, version=v))
    # probe, back, hold 1, probe, back, hold 2, probe, back, hold 4 ...
    assert boosts == pytest.approx([STEP, 1.0, 1.0, STEP, 1.0, 1.0, 1.0, STEP, 1.0, 1.0])


def test_misa_goodput_is_a_named_admission_layer():
    from cadencerl.config import builtin_scenario
    from cadencerl.runs.registry import make_policy

    policy = make_policy("misa-goodput+cache-aware", builtin_scenario("mixed-h100"))
    assert policy.name == "misa-goodput+cache-aware" and isinstance(policy.misa.climb, GoodputClimb)
    assert make_policy("misa+cache-aware", builtin_scenario("mixed-h100")).misa.climb is None


def test_in_front_of_a_policy_that_never_overcommits_the_climber_is_refused_by_name():
    from cadencerl.admission.misa import Admitted
    from cadencerl.config import ConfigError, builtin_scenario
    from cadencerl.policies.routers import CacheAware
    from cadencerl.runs.registry import make_policy

    with pytest.raises(ConfigError, match="admission: misa-goodput .* least-loaded never over-commits"):
        Admitted(MisaT({"rlvr": 1.0}, climb=GoodputClimb()), LeastLoaded(), label="misa-goodput")
    with pytest.raises(ConfigError, match="use misa"):
        make_policy("misa-goodput+cadence", builtin_scenario("mixed-16a8h"))
    assert Admitted(MisaT({"rlvr": 1.0}, climb=GoodputClimb()), CacheAware()).misa.climb is not None
