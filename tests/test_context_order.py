"""The simulator's engines keep their requests in context order (sim/context_order.py): at every
decision, each worker's walk is the order a scan of every resident's context gives."""

import pytest

from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate
from tests.conftest import Watching, small


def _scan(w):
    return sorted((t for t in w.residents.values() if t.resumable), key=lambda t: t.context, reverse=True)


@pytest.mark.parametrize("name, policy, exact", [("16a16b8h", "cadence", False), ("16a16b8h", "laminar", True),
                                                  ("mixed-16a8h", "misa+cadence", False)])
def test_each_workers_walk_is_its_residents_longest_first(name, policy, exact):
    scenario = small(name, trajectories=256, batch=64, cap=8192)
    seen = []

    def check(view):
        for w in view.workers:
            walk = list(w.longest_first())
            assert walk == _scan(w)
            seen.append(len(walk))

    r = simulate(scenario, Watching(make_policy(policy, scenario), check), exact=exact)
    assert r["trajectories_completed"] == 256 and max(seen) > 1
