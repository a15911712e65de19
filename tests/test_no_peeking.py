"""No policy reads a trajectory's target length: the length is sealed and raises when read."""

import pytest

from cadencerl.runs import registry
from cadencerl.runs.simulate import simulate
from cadencerl.policies.least_loaded import LeastLoaded
from cadencerl.core.spec import PeekError
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
