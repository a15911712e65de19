"""Each cost the simulator charges, pinned to a case worked out by hand from the catalog numbers."""

import dataclasses

import pytest

from cadencerl.core.backend import Restore
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker
from cadencerl.hardware import catalog
from cadencerl.hardware.perf import make_perf
from cadencerl.sim.engine import Request, SimEngine
from cadencerl.sim.kv_moves import KvMoves
from cadencerl.sim.links import LinkQueue, Links
from cadencerl.sim.weights import WeightSync

pytestmark = pytest.mark.timeout(60)

KEY = object()
KVB = 144 * 1024                        # Qwen3-8B KV bytes per token
W = 8.2e9 * 2                           # Qwen3-8B weights, BF16
BW = 0.7 * 3350e9                       # H800 effective HBM bandwidth
PEAK = 0.5 * 989e12                     # H800 effective BF16 rate
ATTN = 4 * 36 * 32 * 128                # attention FLOPs per (token x context token)


def h800_perf(budget: int):
    accel = dataclasses.replace(catalog.ACCELERATORS["H800"], max_num_batched_tokens=budget)
    return make_perf(accel, catalog.MODELS["Qwen3-8B"], 1)


def request(engine: SimEngine, prompt: int, target: int, group: int = 0) -> Request:
    """A fresh request; distinct groups share no prompt prefix."""
    traj = Trajectory(TrajectorySpec(group, group, prompt, HiddenLength(target, KEY)))
    return Request(traj, engine, 0, prompt, target, Restore.PREFILL)


def test_a_prefill_is_split_across_steps_by_the_token_budget():
    # 5,000 prompt tokens under a 2,048-token budget: chunks of 2048, 2048 and 904 in three steps;
    # the third also samples the first token, then one decode step per token.
    engine = SimEngine(0, h800_perf(2048), capacity=100_000, max_num_seqs=8)
    req = request(engine, 5000, 3)
    engine.enqueue(req)

    def chunk_step(n, done):
        flops = 2 * 8.2e9 * n + ATTN * n * (done + n / 2)
        return 0.005 + max((W + KVB * done) / BW, flops / PEAK)

    t = engine.restart(0.0)
    expected = chunk_step(2048, 0)
    assert t == pytest.approx(expected)
    for n, done in ((2048, 2048), (904, 4096)):
        finished = []
        t = engine.on_event(t, finished)
        expected += chunk_step(n, done)
        assert t == pytest.approx(expected)
        assert not finished and not engine.running
    t = engine.on_event(t, [])                       # the prompt is in; its first token is out
    assert req.generated() == 1 and engine.prefill_tokens == 5000
    decode = sum(0.005 + max((W + KVB * c) / BW, (2 * 8.2e9 + ATTN * c) / PEAK) for c in (5001, 5002))
    assert t == pytest.approx(expected + decode)     # two decode steps to its third token, in one jump


def test_running_decodes_take_their_tokens_first():
    # Three decodes running under a 2,048 budget leave 2,045 tokens for the prefill chunk.
    engine = SimEngine(0, h800_perf(2048), capacity=100_000, max_num_seqs=8)
    for g in range(3):
        engine.enqueue(request(engine, 100, 50, group=g))
    t = engine.restart(0.0)
    t = engine.on_event(t, [])                       # the three prompts prefilled together
    assert len(engine.running) == 3
    engine.enqueue(request(engine, 3000, 5, group=3))
    t = engine.restart(t)
    t0 = t
    t = engine.on_event(t, [])                       # the first mixed step starts here
    assert engine.chunks and engine.chunks[0][1] == 2048 - 3
    ctx = engine.ctx_total
    flops = 2 * 8.2e9 * (3 + 2045) + ATTN * (ctx + 2045 * 2045 / 2)
    assert t - t0 == pytest.approx(0.005 + max((W + KVB * ctx) / BW, flops / PEAK))


def test_two_transfers_sharing_one_link():
    link = LinkQueue("l", 2.5e9, 1e-3)
    first, second = link.send(0.0, 5e9), link.send(0.0, 5e9)
    assert first == pytest.approx(2.0 + 1e-3)
    assert second == pytest.approx(4.0 + 1e-3)      # the pair ends when fair sharing would end it
    assert link.send(10.0, 2.5e9) == pytest.approx(11.0 + 1e-3)   # an idle link starts at once
    assert link.bytes_moved == 12.5e9


def _weights(style: str, trainer_cluster=None) -> WeightSync:
    return WeightSync(W, ["a", "a", "b"], [1, 1, 2], trainer_cluster, style, Links())


def test_weight_update_on_demand_pays_the_copy_on_the_critical_path():
    ws = _weights("on-demand")
    cross, load1, load2 = W / 2.5e9 + 1e-3, W / 25e9 + 20e-6, W / 50e9 + 20e-6
    ws.publish(0.0)
    assert ws.ready_at(0, 1, 10.0) == pytest.approx(10.0 + cross + load1)
    assert ws.ready_at(1, 1, 10.0) == pytest.approx(10.0 + cross + load1)   # the cluster's copy is reused
    # cluster b's copy queues behind cluster a's on the trainer's egress
    assert ws.ready_at(2, 1, 10.0) == pytest.approx(10.0 + 2 * W / 2.5e9 + 1e-3 + load2)


def test_weight_update_prefetched_at_publish_only_pays_the_load():
    ws = _weights("prefetch")
    ws.publish(0.0)                                   # both cluster copies leave at once
    assert ws.ready_at(0, 1, 100.0) == pytest.approx(100.0 + W / 25e9 + 20e-6)
    assert ws.ready_at(2, 1, 1.0) == pytest.approx(2 * W / 2.5e9 + 1e-3 + W / 50e9 + 20e-6)


def test_weight_update_in_the_trainers_cluster_skips_the_cross_link():
    ws = _weights("on-demand", trainer_cluster="a")
    assert ws.ready_at(0, 1, 5.0) == pytest.approx(5.0 + W / 25e9 + 20e-6)


@pytest.mark.parametrize("policy, style", [("sync", "on-demand"), ("one-off", "prefetch"), ("laminar", "prefetch"),
                                           ("areal", "on-demand"), ("cadence", "on-demand")])
def test_each_policy_declares_its_overlap(policy, style):
    from tests.conftest import sim, small
    r = sim(small("16a16b8h", trajectories=96, batch=32, cap=1024), policy)
    assert r["weight_sync"] == style
    assert r["weight_updates"] > 0 and r["weight_wait_s"] > 0


def test_an_engine_waits_for_its_weights():
    engine = SimEngine(0, h800_perf(2048), capacity=100_000, max_num_seqs=8)
    engine.ready_at = 7.0
    engine.enqueue(request(engine, 100, 5))
    assert engine.restart(0.0) == 7.0 and not engine.prefilling
    t = engine.on_event(7.0, [])
    assert engine.prefilling and t > 7.0


def _kv_pool(relays: int, tp: int = 2):
    workers = [Worker(i, "H800", "c", tp, 10**6, 64, 0) for i in range(2)]
    perf = make_perf(catalog.ACCELERATORS["H800"], catalog.MODELS["Qwen3-8B"], tp)
    return workers, KvMoves(workers, [perf, perf], Links(), staging=True, relays=relays)


@pytest.mark.parametrize("relays", [1, 4])
def test_fan_in_fetches_every_stripe_at_once(relays):
    workers, kv = _kv_pool(relays)
    tokens = 10_000
    b = tokens * KVB
    kv.depart(7, 0, tokens, 0.0)
    snapshot = b / (2 * 54e9) + 10e-6                 # host copy over both devices' PCIe
    relay_rate = relays * 25e9                        # the relays' NICs add up
    # staging: out of the source's two NICs (50 GB/s) into the relays
    assert kv.staged[7][1] == pytest.approx(snapshot + b / min(50e9, relay_rate) + 20e-6)
    delay = kv.fetch(7, workers[0], workers[1], tokens, 10.0, reprefill=100.0)
    # fetch: every relay sends its stripe at once; the destination's two NICs take 50 GB/s in
    assert delay == pytest.approx(b / min(relay_rate, 50e9) + 20e-6)
    assert kv.links.bytes_by_link() == {"host": pytest.approx(b), "intra-cluster:c": pytest.approx(2 * b)}


def test_a_transfer_slower_than_re_prefill_falls_back():
    workers, kv = _kv_pool(1)
    kv.depart(7, 0, 10_000, 0.0)
    assert kv.fetch(7, workers[0], workers[1], 10_000, 10.0, reprefill=1e-3) is None
    assert kv.fallbacks == 1


def test_kv_never_moves_across_clusters():
    workers, kv = _kv_pool(4)
    other = Worker(2, "H800", "elsewhere", 2, 10**6, 64, 0)
    kv.depart(7, 0, 100, 0.0)
    assert kv.fetch(7, workers[0], other, 100, 1.0, reprefill=100.0) is None


def test_a_direct_move_goes_gpu_to_gpu_at_placement():
    workers = [Worker(i, "H800", "c", 1, 10**6, 64, 0) for i in range(3)]
    perf = make_perf(catalog.ACCELERATORS["H800"], catalog.MODELS["Qwen3-8B"], 1)
    kv = KvMoves(workers, [perf] * 3, Links(), staging=False)
    b = 10_000 * KVB
    kv.depart(1, 0, 10_000, 0.0)
    kv.depart(2, 0, 10_000, 0.0)
    # both leave through the source's one NIC (25 GB/s): the second waits for the first
    assert kv.fetch(1, workers[0], workers[1], 10_000, 0.0, reprefill=100.0) == pytest.approx(b / 25e9 + 20e-6)
    assert kv.fetch(2, workers[0], workers[2], 10_000, 0.0, reprefill=100.0) == pytest.approx(2 * b / 25e9 + 20e-6)
    assert kv.links.bytes_by_link() == {"intra-cluster:c": pytest.approx(2 * b)}


def test_token_budgets_follow_vllm_defaults():
    # vLLM 0.32 API server: 8192 on >= 70 GiB parts (not A100), 2048 below, 16384 from 160 GiB; CPU 2048
    budgets = {name: a.max_num_batched_tokens for name, a in catalog.ACCELERATORS.items()}
    assert budgets["H800"] == budgets["H200"] == budgets["A800"] == 8192
    assert budgets["A100"] == budgets["L40S"] == budgets["A910X"] == budgets["BI-V150"] == 2048
    assert budgets["MI300X"] == 16384


def test_the_cpu_pair_chunks_prefill_like_its_real_servers():
    from cadencerl.config import builtin_scenario
    from cadencerl.devpool.local_pool import PoolConfig
    from cadencerl.runs.assemble import build_pool

    workers, perfs = build_pool(builtin_scenario("cpu-pair"))
    assert {p.token_budget for p in perfs} == {2048}            # no --max-num-batched-tokens is passed
    assert {p.accel.kv_block_tokens for p in perfs} == {PoolConfig().block_size}
    assert {w.kv_capacity for w in workers} == {8192}


def test_a_scenario_may_put_its_trainer_in_a_cluster_of_the_pool():
    """Named, the trainer's cluster takes the weights over its NICs alone (no cross-cluster copy);
    a name that is not one of the pool's clusters is refused, naming the field."""
    from cadencerl.config import ConfigError
    from tests.conftest import sim, small

    s = small("32b", trajectories=96, batch=32, cap=1024)
    away = sim(s, "least-loaded")
    local = sim(s.with_overrides(trainer={"cluster": s.pool[0].cluster_name}), "least-loaded")
    assert away["link_bytes"].get("cross-cluster", 0) > 0 and local["link_bytes"].get("cross-cluster", 0) == 0
    assert 0 < local["weight_wait_s"] < away["weight_wait_s"]
    with pytest.raises(ConfigError, match="trainer.cluster: 'elsewhere' is not a cluster of the pool"):
        s.with_overrides(trainer={"cluster": "elsewhere"})
