"""The rollout driver's fixed cap on sessions in flight (`cap<N>+<policy>`, admission/session_cap.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cadencerl.admission.session_cap import SessionCap
from cadencerl.config import ConfigError
from cadencerl.core.actions import Admit
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate
from tests.test_misa_routers import mixed


def view_with(open_sessions: dict[str, int], waiting: list[str]) -> SimpleNamespace:
    return SimpleNamespace(active_by_class=open_sessions, fresh=SimpleNamespace(classes=lambda: waiting))


def test_the_gate_opens_below_the_cap_and_closes_at_it():
    cap = SessionCap(10)
    below = view_with({"agent": 6, "rlvr": 3}, ["agent", "rlhf"])
    assert cap.open_classes(below) == {"agent", "rlhf"}
    assert cap.accepts(below, worker=None) and cap.remaining(below) == 1
    full = view_with({"agent": 6, "rlvr": 4}, ["agent", "rlhf"])
    assert cap.open_classes(full) == set()
    assert not cap.accepts(full, worker=None) and cap.remaining(full) == 0


def test_a_capped_router_never_has_more_sessions_open_and_conserves():
    scenario = mixed()
    policy = make_policy("cap40+cache-aware", scenario)
    assert policy.name == "cap40+cache-aware"
    peak = {"open": 0}
    inner_decide = policy.decide

    def decide(view):
        for action in inner_decide(view):
            yield action
            if isinstance(action, Admit):   # applied by now
                peak["open"] = max(peak["open"], sum(view.active_by_class.values()))

    policy.decide = decide
    r = simulate(scenario, policy)
    assert r["trajectories_completed"] == 600
    assert peak["open"] == 40       # the cap binds on this load, and is never passed


@pytest.mark.parametrize("name, field", [("cap0+cache-aware", "admission"), ("capx+cache-aware", "admission"),
                                         ("cap8+nonsense", "policy")])
def test_bad_caps_are_refused_naming_the_field(name, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        make_policy(name, mixed())
