"""Unit tests of the live router's adapter (`LiveState`), its settings, and its reading of vLLM's /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadencerl.config import ConfigError
from cadencerl.core.actions import Admit, Place
from cadencerl.core.trajectory import State
from cadencerl.core.worker import Worker
from cadencerl.engine.server_metrics import parse_metrics, series_total
from cadencerl.router.live import LiveState
from cadencerl.router.policy import router_policy
from cadencerl.router.prompt_keys import resume_group
from cadencerl.router.resumes import Resumes
from cadencerl.router.settings import make_settings, read_classes
from tests.conftest import ran_in_plain_python

pytestmark = pytest.mark.timeout(30)


def _state(policy: str = "misa+cache-aware", workers: int = 2, ttl: float = 10.0, max_sessions: int = 100) -> LiveState:
    settings = make_settings(workers=[f"http://w{i}:1" for i in range(workers)], policy=policy)
    ws = [Worker(id=i, accelerator="vllm", cluster="f", tp=1, kv_capacity=10_000, max_num_seqs=8, rank=0)
          for i in range(workers)]
    return LiveState(router_policy(settings), ws, settings.target_mix, session_ttl_s=ttl, max_sessions=max_sessions)


def test_a_session_is_admitted_then_its_continuation_returns_to_its_worker() -> None:
    st = _state()
    s = st.new_session("a", "agent", 100, group=1)
    actions = st.decide(0.0)
    assert actions == [Admit(s.traj.worker, s.traj.id)] and s.traj.state is State.RESIDENT
    home = s.traj.worker
    st.turn_ended(s, 50, 0.5)
    assert s.traj.state is State.TOOL and st.workers[home].sessions == 1 and st.workers[home].load == 0
    st.continuation(s, 100 + 50 + 30, 1.0)
    assert s.traj.observation_tokens == 30
    assert st.decide(1.0) == [Place(s.traj.id, home)]
    st.finished(s, 20, 1.5)
    assert s.traj.state is State.DONE and st.workers[home].sessions == 0
    assert st.live == {} and st.by_key == {} and st.completed["agent"] == 1


def test_misa_holds_new_sessions_beyond_its_caps_and_admits_when_one_finishes() -> None:
    st = _state(workers=1)
    sessions = [st.new_session(f"s{i}", "rlvr", 50, group=i) for i in range(10)]
    st.decide(0.0)
    admitted = [s for s in sessions if s.traj.state is State.RESIDENT]
    held = [s for s in sessions if s.traj.state is State.FRESH]
    assert admitted and held and len(st.hold) == len(held)
    st.finished(admitted[0], 10, 0.1)
    st.decide(0.1)
    assert held[0].traj.state is State.RESIDENT   # the earliest held session goes first


def _park_the_admitted(st: LiveState) -> tuple[list, list]:
    """Ten new sessions; those admitted end their turn at 0.2 s and park (the rest stay held)."""
    first = [st.new_session(f"s{i}", "agent", 50, group=i) for i in range(10)]
    st.decide(0.0)
    running = [s for s in first if s.traj.state is State.RESIDENT]
    for s in running:
        st.turn_ended(s, 10, 0.2)
    st.decide(0.2)
    return first, running


def test_parked_sessions_count_against_the_cap_until_their_ttl() -> None:
    st = _state(workers=1, ttl=5.0)
    first, running = _park_the_admitted(st)
    still_held = [s for s in first if s.traj.state is State.FRESH]
    assert still_held, "parked sessions keep their slot: nothing new is admitted while they wait on tools"
    assert st.expire(3.0) == 0
    assert st.expire(5.3) == len(running) and not st.parked
    st.decide(5.3)
    assert still_held[0].traj.state is State.RESIDENT


def test_parked_sessions_are_bounded() -> None:
    st = _state(policy="cache-aware", max_sessions=3)
    for i in range(10):
        s = st.new_session(f"s{i}", "agent", 10, group=i)
        st.decide(float(i))
        st.turn_ended(s, 5, float(i) + 0.5)
    assert len(st.parked) == 3 and len(st.live) == 3 and st.completed["agent"] == 7


def test_withdraw_bounce_and_exclude() -> None:
    st = _state(policy="cache-aware")
    s = st.new_session(None, "rlhf", 10, group=1)
    t = st.new_session(None, "rlhf", 10, group=2)
    st.decide(0.0)
    first = s.traj.worker
    st.bounce(s, 0.1)
    assert s.traj.state is State.PENDING and st.workers[first].load == 0
    assert st.decide(0.1, exclude=frozenset({first})) == [Place(s.traj.id, 1 - first)]
    assert st.workers[first].alive   # excluded for one pass only
    u = st.new_session(None, "rlhf", 10, group=3)
    st.workers[0].alive = st.workers[1].alive = False
    st.decide(0.2)
    st.withdraw(u)
    assert len(st.hold) == 0 and u.traj.id not in st.live
    assert t.traj.state is State.RESIDENT


@pytest.mark.timeout(120)    # compiled, it runs again in a plain-Python interpreter
def test_a_live_router_refuses_actions_it_cannot_apply(request) -> None:
    if ran_in_plain_python(request):        # it patches the policy's method
        return
    st = _state(policy="cache-aware")
    st.policy.decide = lambda view: iter([object()])
    with pytest.raises(ValueError):
        st.decide(0.0)


def test_mix_dtv() -> None:
    st = _state(policy="cache-aware")
    assert st.mix_dtv() == 0.0
    for cls in ["agent"] * 486 + ["rlvr"] * 331 + ["rlhf"] * 182:
        s = st.new_session(None, cls, 10, group=1)
        st.decide(0.0)
        st.finished(s, 1, 0.0)
    assert st.mix_dtv() < 0.001
    assert st.mix_dtv(recent=True) > 0.3       # the latest 256 are all RLHF


def test_hold_queue_grows_in_arrival_order() -> None:
    st = _state(policy="cache-aware")
    a, b = (st.new_session(None, "rlvr", 1, 1).traj for _ in range(2))
    q = st.hold                 # the controller's fresh queue, growing as requests arrive
    assert len(q) == 2 and q.peek() is a and q.peek({"agent"}) is None
    st.withdraw(st.live[b.id])
    assert q.peek() is a and len(q) == 1 and b.id not in st.controller.trajectories


def test_vllm_metrics_set_the_workers_kv_and_queue() -> None:
    text = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 5.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 30.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 120.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="512"} 1.0
"""
    fig = parse_metrics(text)
    st = _state()
    st.set_figures(0, fig)
    w = st.workers[0]
    assert (w.kv_capacity, w.engine_kv, w.num_waiting, w.preemptions) == (8192, 2048, 2, 5)


@pytest.mark.parametrize("fields, field", [
    ({"workers": []}, "workers"), ({"workers": ["ftp://x"]}, "workers"),
    ({"workers": ["http://a:1"], "policy": "sync"}, "policy"), ({"workers": ["http://a:1"], "policy": "nope"}, "policy"),
    ({"workers": ["http://a:1"], "classes": {"a": 0}}, "classes"),
    ({"workers": ["http://a:1"], "cache_threshold": 2}, "cache_threshold"),
    ({"workers": ["http://a:1"], "default_class": "zzz"}, "default_class"),
])
def test_bad_settings_name_their_field(fields: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_settings(**fields)
    assert err.value.args[0].startswith(field) and "\n" not in err.value.args[0]


def test_classes_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("agent: 2\nrlvr: 1\nrlhf: 1\ndefault: rlhf\n")
    shares, default = read_classes(path)
    settings = make_settings(workers=["http://a:1"], classes=shares, default_class=default)
    assert settings.target_mix == {"agent": 0.5, "rlvr": 0.25, "rlhf": 0.25} and settings.fallback_class == "rlhf"
    path.write_text("- a\n")
    with pytest.raises(ConfigError, match="^classes"):
        read_classes(path)


def test_consistent_hash_maps_one_key_to_one_worker_across_sessions_and_replicas() -> None:
    one, other = _state("consistent-hash", workers=4), _state("consistent-hash", workers=4)
    for i in range(7):                       # the replicas' trajectory counters differ
        other.new_session(None, "rlvr", 10, group=i, route_key=f"burn{i}")
    other.decide(0.0)

    def home(st: LiveState, key: str) -> int:
        s = st.new_session(None, "rlvr", 10, group=0, route_key=key)
        st.decide(0.0)
        worker = s.traj.worker
        st.finished(s, 1, 0.0)               # the session ends: the next one with this key is new
        return worker

    keys = [f"user:{i}" for i in range(16)]
    first = [home(one, k) for k in keys]
    assert [home(one, k) for k in keys] == first == [home(other, k) for k in keys]
    assert len(set(first)) > 1


def test_consistent_hash_gives_a_worker_added_later_its_share() -> None:
    st = _state("consistent-hash", workers=2)
    st.new_session(None, "rlvr", 10, group=0, route_key="user:first")
    st.decide(0.0)
    st.workers.append(Worker(id=2, accelerator="vllm", cluster="f", tp=1, kv_capacity=10_000, max_num_seqs=8,
                             rank=0))
    sessions = [st.new_session(None, "rlvr", 10, group=i, route_key=f"user:{i}") for i in range(40)]
    st.decide(0.0)
    assert any(s.traj.worker == 2 for s in sessions)


def test_waiting_sessions_longer_than_a_limit_are_withdrawn_held_or_pending() -> None:
    st = _state(policy="cache-aware", workers=1)
    parked = st.new_session("p", "agent", 100, group=1)
    st.decide(0.0)
    st.turn_ended(parked, 50, 0.1)
    st.continuation(parked, 400, 0.2)              # its next turn, 400 tokens, waits for a server
    st.workers[0].alive = False
    short, long = st.new_session("s", "rlvr", 100, group=2), st.new_session("l", "rlvr", 300, group=3)
    assert st.refuse_longer_than(300, 0.3) == [long, parked]
    assert long.traj.state is State.DONE and parked.traj.state is State.DONE and st.workers[0].sessions == 0
    assert [t.id for t in st.hold.in_order()] == [short.traj.id] and len(st.pending) == 0
    assert set(st.live) == {short.traj.id} and st.completed["agent"] == 1


def test_waiting_sessions_pinned_to_a_worker_that_left_or_cannot_hold_them_are_withdrawn() -> None:
    st = _state(policy="round-robin", workers=3)
    st.workers[1].kv_capacity = 200
    dead, big, fits, free = (st.new_session(None, "rlvr", n, group=i, pin=pin)
                             for i, (n, pin) in enumerate(((10, 0), (300, 1), (100, 1), (300, None))))
    st.workers[0].alive = False
    assert st.refuse_pinned_to_dead(0.1) == [dead]
    assert st.refuse_pinned_too_long(0.1) == [big]
    assert dead.traj.state is State.DONE and big.traj.state is State.DONE
    assert [t.id for t in st.hold.in_order()] == [fits.traj.id, free.traj.id]
    assert st.decide(0.2) == [Admit(1, fits.traj.id), Admit(2, free.traj.id)]


def test_misa_caps_do_not_hold_a_pinned_session_but_its_class_gate_still_does() -> None:
    st = _state(workers=2)
    for w in st.workers:
        w.max_num_seqs = 2
    first = [st.new_session(f"s{i}", "rlvr", 50, group=i) for i in range(6)]
    st.decide(0.0)
    for s in [s for s in first if s.traj.state is State.FRESH]:
        st.withdraw(s)                                   # the caps are full: the rest were held
    pinned = st.new_session(None, "rlvr", 50, group=98, pin=0)
    assert st.decide(0.1) == [Admit(0, pinned.traj.id)], "its worker's cap does not hold it"
    second = st.new_session(None, "rlvr", 50, group=99, pin=1)
    assert st.decide(0.2) == [] and second.traj.state is State.FRESH, "its class is over its quota now"


@pytest.mark.parametrize("policy", ["cadence", "least-loaded"])
def test_eta_holds_new_sessions_until_a_weight_update_consumes_a_batch(policy: str) -> None:
    """--eta 0, batch 2: two sessions run; their completions wait to be trained on, so no third
    starts until the clients publish a version (the batch is consumed), as AReaL's staleness
    manager counts `(eta + version + 1) * batch - (accepted + running)`."""
    settings = make_settings(workers=["http://w0:1", "http://w1:1"], policy=policy)
    ws = [Worker(id=i, accelerator="vllm", cluster="f", tp=1, kv_capacity=10_000, max_num_seqs=8, rank=0)
          for i in range(2)]
    st = LiveState(router_policy(settings), ws, settings.target_mix, batch_size=2, eta=0)
    sessions = [st.new_session(None, "rlvr", 50, group=i) for i in range(5)]
    st.decide(0.0)
    running = [s for s in sessions if s.traj.state is State.RESIDENT]
    assert len(running) == 2
    for s in running:
        st.finished(s, 10, 1.0)
    st.decide(1.0)
    assert sum(s.traj.state is State.RESIDENT for s in sessions) == 0       # accepted, not yet trained on
    st.controller.publish(2.0)              # what /areal_update_weights does: the next version, on every worker
    st.controller.switch_all(2.0)
    st.decide(2.0)
    again = [s for s in sessions if s.traj.state is State.RESIDENT]
    assert len(again) == 2 and all(s.traj.tag == 1 for s in again)
    trainer = st.controller.trainer
    assert trainer.consumed == 2 and dict(trainer.staleness) == {0: 2}


def test_without_eta_every_session_may_start() -> None:
    st = _state("least-loaded")
    sessions = [st.new_session(None, "rlvr", 50, group=i) for i in range(12)]
    st.decide(0.0)
    assert sum(s.traj.state is State.RESIDENT for s in sessions) == 12


def test_handed_back_samples_of_one_prompt_are_each_resumed_once() -> None:
    """Samples of one prompt handed back with the same tokens (a pause before their first token)
    look alike to the router: each re-send takes one of them, none is lost or taken twice."""
    st = _state("least-loaded")
    resumes = Resumes()
    prompt = (5, 6, 7)
    sessions = [st.new_session(None, "rlvr", len(prompt), group=1, resumable=True) for _ in range(3)]
    st.decide(0.0)
    for s in sessions:
        resumes.start(s)
    resumes.pause()
    assert [resumes.handed_back(s, prompt, [], 1.0) for s in sessions] == ["pause"] * 3
    group = resume_group(prompt, [])
    taken = [resumes.take(group) for _ in range(4)]
    assert taken == [*sessions, None]


def test_a_resend_that_never_comes_ends_without_a_sample() -> None:
    st = _state("least-loaded")
    resumes = Resumes()
    s = st.new_session(None, "rlvr", 3, group=1, resumable=True)
    st.decide(0.0)
    resumes.start(s)
    resumes.handed_back(s, (5, 6, 7), [9, 9], 1.0)          # still resident (a pause keeps it placed)
    resumes.end_unsent(st, 5.0, ttl_s=10.0)
    assert s.traj.state is State.RESIDENT
    resumes.end_unsent(st, 11.0, ttl_s=10.0)
    assert s.traj.state is State.DONE and not st.live and not resumes.evicted_at
    assert st.controller.done == 1 and st.controller.trainer.ready.total() == 0    # no sample for the trainer
    assert all(w.load == 0 for w in st.workers)


def test_series_total_sums_a_series_over_its_labels() -> None:
    page = ('# TYPE x counter\nx_total{why="pause"} 12.0\nx_total{why="evicted"} 2.0\n'
            '# TYPE y gauge\ny 3.0\n')
    assert series_total(page, "x_total") == 14 and series_total(page, "x_total", why="evicted") == 2
    assert series_total(page, "y") == 3 and series_total(page, "absent") == 0


def test_a_parked_session_ends_at_the_contended_ttl_while_new_sessions_wait() -> None:
    """Clients that never send a next turn must not keep new work out for the whole session TTL."""
    st = _state(workers=1, ttl=60.0)
    st.contended_ttl_s = 2.0
    first, running = _park_the_admitted(st)
    assert st.hold and st.expire(1.0) == 0, "within the contended TTL: parked sessions keep their slots"
    assert st.expire(2.3) == len(running)
    st.decide(2.3)
    assert any(s.traj.state is State.RESIDENT for s in first if s not in running), "a held session got in"


def test_with_nothing_waiting_a_parked_session_lives_its_whole_ttl() -> None:
    st = _state(workers=1, ttl=60.0)
    st.contended_ttl_s = 2.0
    s = st.new_session("s0", "agent", 50, group=0)
    st.decide(0.0)
    st.turn_ended(s, 10, 0.2)
    assert not st.hold and st.expire(30.0) == 0 and st.expire(60.3) == 1
