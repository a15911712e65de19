"""No policy reads a trajectory's target length: the length is sealed and raises when read."""

import pytest

from cadencerl.config import builtin_scenario
from cadencerl.core.spec import NO_TURNS, PeekError
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.runs import registry
from cadencerl.runs.simulate import simulate
from tests.conftest import sim, small


class Peeker(LeastLoaded):
    name = "peeker"

    def decide(self, view):
        for w in view.workers:
            for t in w.residents.values():
                if t.spec.response > 1000:  # what an oracle would like to know
                    pass
        yield from super().decide(view)


def test_a_policy_that_peeks_fails_loudly():
    with pytest.raises(PeekError):
        simulate(small("16a8h", trajectories=64, batch=16), Peeker())


@pytest.mark.parametrize("policy", registry.policy_names())
def test_every_policy_runs_with_sealed_lengths(policy):
    scenario = small("h800-16" if policy.startswith("dora") else "16a16b8h", trajectories=160, batch=40)
    r = sim(scenario, policy)
    assert r["trajectories_completed"] == 160


class MeterReader(LeastLoaded):
    """Reads what a resident's meter shows besides its token count (the engine request knows where
    the turn ends); records what it found."""
    name = "meter-reader"

    def __init__(self):
        super().__init__()
        self.shown: set[str] = set()

    def decide(self, view):
        for w in view.workers:
            for t in w.residents.values():
                if t.meter is not None:
                    self.shown |= {a for a in dir(t.meter) if not a.startswith("_")}
        yield from super().decide(view)


def test_a_residents_meter_shows_its_token_count_and_nothing_else():
    reader = MeterReader()
    simulate(small("16a8h", trajectories=64, batch=16), reader)
    assert reader.shown == {"generated"}


class TurnCounter(LeastLoaded):
    name = "turn-counter"

    def decide(self, view):
        for w in view.workers:
            for t in w.residents.values():
                if len(t.spec.later_turns) > 2:   # how many tool calls are left: the environment's future
                    pass
        yield from super().decide(view)


def test_a_policy_that_counts_the_turns_left_fails_loudly():
    with pytest.raises(PeekError):
        simulate(builtin_scenario("mixed-h200").with_overrides(workload={"trajectories": 64},
                                                                trainer={"batch_size": 16}), TurnCounter())


class TurnsLeftProbe(LeastLoaded):
    """Asks whether a resident has turns left without counting them: by a keyless read, or by
    telling the shared empty value apart."""

    name = "turns-left-probe"

    def __init__(self, probe):
        super().__init__()
        self.probe = probe

    def decide(self, view):
        for w in view.workers:
            for t in w.residents.values():
                if t.workload_class != "agent":      # single-turn classes: their future is empty
                    self.probe(t.spec.later_turns)
        yield from super().decide(view)


def test_whether_a_session_has_turns_left_is_sealed_too():
    """A single-turn session's empty future is sealed like any other: a keyless read raises as it
    does for a session with turns left, and it is not the shared value hand-built requests carry."""
    scenario = builtin_scenario("mixed-h200").with_overrides(workload={"trajectories": 64},
                                                             trainer={"batch_size": 16})
    with pytest.raises(PeekError):
        simulate(scenario, TurnsLeftProbe(lambda turns: turns.reveal(None)))
    shared = []
    simulate(scenario, TurnsLeftProbe(lambda turns: shared.append(turns is NO_TURNS)))
    assert shared and not any(shared)
