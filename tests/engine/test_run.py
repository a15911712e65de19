"""The controller and policies on real vLLM CPU servers: `cadencerl run`, the trainer API, faults.

The `engine` tests share the session's 2-server pool (tests/engine/conftest.py); the kill test
starts one extra server of its own and kills it mid-run. A test workload is the built-in
`cpu-pair` scenario with shorter responses, about half a minute per run. The controller may use
only 1,536 KV tokens per server (the servers hold 8,192, so they never preempt), with a 15%
headroom floor and a 32-token decode reserve: CadenceRL's pacing then runs out of headroom as
residents grow and evicts the longest one (5-8 times per run in `sim` over three seeds), and a
version change drains a worker; both kinds of eviction resume, from the last received token, on
a worker of their version.
The other tests need no server.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadencerl.api import RolloutPool
from cadencerl.cli.main import app
from cadencerl.config import ConfigError, builtin_scenario
from cadencerl.devpool.local_pool import LocalPool, PoolConfig
from cadencerl.devpool.processes import group_members
from cadencerl.engine.calibrate import StepSample, fit
from cadencerl.engine.prompts import synthetic_prompt
from cadencerl.engine.server_metrics import kv_tokens_from_metrics
from cadencerl.hardware import catalog
from cadencerl.hardware.perf import make_perf
from cadencerl.runs.real import parse_urls, resolve_labels
from cadencerl.runs.registry import make_policy
from tests.conftest import sim

KV_TOKENS = 1536
TRAJECTORIES = 96


def workload():
    return builtin_scenario("cpu-pair").with_overrides(
        workload={"trajectories": TRAJECTORIES, "response": {"median": 80, "sigma": 1.0, "cap": 640}},
        cadence={"delta": 32, "headroom_floor": 0.15})


def run_pool(policy: str, urls: list[str], *, on_progress=None) -> tuple[dict, RolloutPool, dict]:
    """A whole run through the trainer API with a zero-time trainer; returns the figures, the pool
    (for its controller and backend) and every trajectory's target length (the test is an oracle)."""
    s = workload()
    with RolloutPool.from_scenario(s, urls, policy=policy, kv_tokens=KV_TOKENS, deadline_s=240) as pool:
        if on_progress is not None:
            pool.progress = lambda done, total: on_progress(pool, done, total)
        versions = []
        for batch in pool.batches():
            assert batch.samples and all(batch.index - x.tag <= s.controller.eta for x in batch.samples)
            versions.append(pool.publish())
        result = pool.result()
        targets = {t.id: t.spec.response.reveal(pool._key) for t in pool.controller.trajectories.values()}
    assert versions == list(range(1, len(versions) + 1))
    return result, pool, targets


def check_conservation(result: dict, pool: RolloutPool, targets: dict) -> None:
    assert result["trajectories_completed"] == TRAJECTORIES
    assert pool.backend.verify() == []
    assert set(pool.backend.env.completions.values()) == {1}
    for t in pool.controller.trajectories.values():
        ids = pool.backend.token_ids(t.id)
        assert t.tokens == targets[t.id] == len(ids) - t.prompt_len, t.id
        assert ids[: t.prompt_len] == synthetic_prompt(pool.scenario.seed, t.group, t.prompt_len)
    assert result["tokens_generated"] == sum(targets.values())
    assert sum(w["tokens_generated"] for w in result["workers"]) >= result["tokens_generated"]


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_cadence_on_the_real_pair_evicts_and_resumes(engine_pool: LocalPool) -> None:
    result, pool, targets = run_pool("cadence", engine_pool.urls)
    check_conservation(result, pool, targets)
    # Which mechanism evicts (pacing or a drain at a version change) depends on timing on a real
    # machine; that CadenceRL evicted, and that every resume was taken up by the server, does not.
    assert result["evictions"] >= 1 and result["resumes"] >= 1
    assert result["resumes_accepted"] >= 1   # the server took prompt + generated ids and extended them
    resumed = [t for t in pool.controller.trajectories.values() if t.placements > 1]
    assert resumed and all(t.tokens == targets[t.id] for t in resumed)
    # A starved machine can time out a connect to a live server (that request was never sent) or a
    # stream's read; both are re-issued from the tokens received. Any other break of a stream that
    # reached a healthy server is a fault, and fails here with its reasons.
    assert result["lost_workers"] == []
    load_induced = result["stream_retries_unsent"] + result["stream_retries_timed_out"]
    assert result["stream_retries"] == load_induced, result["stream_retry_errors"]
    assert all(w["samples"] > 0 and w["max_committed"] > 0 for w in result["workers"])
    assert result["backend"] == "vllm" and result["makespan_wall_s"] > 0
    print(f"\ncadence: {result['throughput_tok_s']:.0f} tok/s, P95 {result['latency_p95_s']:.1f} s, "
          f"{result['evictions']} evictions, {result['resumes']} resumes")


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_least_loaded_on_the_real_pair(engine_pool: LocalPool) -> None:
    result, pool, targets = run_pool("least-loaded", engine_pool.urls)
    check_conservation(result, pool, targets)
    assert result["evictions"] == 0 and result["resumes"] == 0
    assert all(w["tokens_generated"] > 0 for w in result["workers"])
    print(f"\nleast-loaded: {result['throughput_tok_s']:.0f} tok/s, P95 {result['latency_p95_s']:.1f} s")


@pytest.mark.engine
@pytest.mark.timeout(420)
def test_killed_server_mid_run_everything_completes_on_the_survivor(
        engine_pool: LocalPool, tiny_model_dir: Path, tmp_path: Path) -> None:
    config = PoolConfig(num_workers=1, kv_tokens=8192, max_num_seqs=32, max_model_len=2048,
                        model_dir=tiny_model_dir, start_timeout_s=180)
    with LocalPool(tmp_path / "doomed", config) as doomed:
        (server,) = doomed.servers
        members = group_members(server.pid)
        killed: list[int] = []   # residents of the doomed worker when it was killed
        streamed: list[int] = []  # tokens those residents had received by then

        def kill_midway(pool: RolloutPool, done: int, total: int) -> None:
            residents = list(pool.controller.workers[1].residents.values())
            if done >= total // 3 and residents and not killed:
                os.killpg(server.pid, signal.SIGKILL)
                killed.append(len(residents))
                streamed.append(sum(t.generated for t in residents))

        result, pool, targets = run_pool("cadence", [engine_pool.urls[0], server.url], on_progress=kill_midway)
        assert killed and killed[0] >= 1
        check_conservation(result, pool, targets)
        assert result["lost_workers"] == [1]
        assert [w["alive"] for w in result["workers"]] == [True, False]
        if streamed[0] > 0:  # they had tokens: at least one continued from its last one on the survivor
            assert result["resumes_accepted"] >= 1
        survivors = [t for t in pool.controller.trajectories.values() if t.completed_at > 0]
        assert len(survivors) == TRAJECTORIES
    assert all(not group_members(pid) for pid in members) and not group_members(server.pid)


# --- no server needed ---------------------------------------------------------------------------

runner = CliRunner()


@pytest.mark.parametrize("args, field", [
    (["run", "-s", "cpu-pair"], "workers"),
    (["run", "-s", "cpu-pair", "--local", "2", "--workers", "http://127.0.0.1:1"], "workers"),
    (["run", "-s", "cpu-pair", "--workers", "ftp://x"], "workers"),
    (["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:1,http://127.0.0.1:2", "--labels", "cpu-tiny"], "labels"),
    (["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:1", "--labels", "TPU9"], "labels"),
    (["run", "-s", "cpu-pair", "--local", "0"], "local"),
    (["run", "-s", "cpu-pair", "--local", "2", "-p", "nope"], "policy"),
    (["run", "-s", "nope", "--local", "2"], "scenario"),
    (["pool", "up", "--workers", "0"], "workers"),
    (["pool", "up", "--kv-tokens", "1024", "--max-model-len", "2048"], "max_model_len"),
    (["calibrate", "--local", "1", "--batches", "1,x"], "batches"),
    (["calibrate", "--workers", "http://127.0.0.1:1", "--tokens", "4"], "tokens"),
])
def test_bad_input_is_one_line_naming_the_field(args: list[str], field: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), r.output
    assert "Traceback" not in r.output


@pytest.mark.timeout(30)
def test_unreachable_server_is_a_clear_error_not_a_hang() -> None:
    from cadencerl.runs.real import assemble

    s = builtin_scenario("cpu-pair")
    with pytest.raises(ConfigError, match=r"^workers: .*127\.0\.0\.1"):
        assemble(s, make_policy("cadence", s), ["http://127.0.0.1:9"], [], object(), connect_timeout_s=1.0)


def test_urls_and_labels() -> None:
    assert parse_urls("http://127.0.0.1:8001/, http://127.0.0.1:8002") == ["http://127.0.0.1:8001",
                                                                              "http://127.0.0.1:8002"]
    with pytest.raises(ConfigError, match="twice"):
        parse_urls("http://a:1,http://a:1")
    s = builtin_scenario("cpu-pair")
    assert resolve_labels(s, 2, None) == ["cpu-tiny", "cpu-tiny"]
    assert resolve_labels(s, 3, None) == ["cpu-tiny"] * 3
    assert resolve_labels(s, 1, ["H800"]) == ["H800"]


def test_submit_validates_and_seals_lengths() -> None:
    pool = RolloutPool(["http://127.0.0.1:1"])
    tid = pool.submit([5, 6, 7], max_tokens=10, group=3)
    assert tid == 0 and pool._specs[0].group == 3 and pool._specs[0].prompt_len == 3
    with pytest.raises(ValueError, match="max_tokens"):
        pool.submit([1], max_tokens=0)
    with pytest.raises(ValueError, match="token_ids"):
        pool.submit([], max_tokens=4)
    with pytest.raises(RuntimeError, match="publish"):
        pool.publish()


def test_synthetic_prompts_are_shared_by_a_group() -> None:
    a, b = synthetic_prompt(0, 7, 40), synthetic_prompt(0, 7, 60)
    assert b[:40] == a and synthetic_prompt(0, 8, 40) != a
    assert all(1 <= t < 4096 for t in b)


def test_kv_tokens_from_metrics() -> None:
    text = ('# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="32",engine="0",'
            'kv_cache_size_tokens="8192",num_gpu_blocks="256"} 1.0\n')
    assert kv_tokens_from_metrics(text) == 8192
    assert kv_tokens_from_metrics(text.replace('kv_cache_size_tokens="8192",', "")) == 8192
    assert kv_tokens_from_metrics("") is None


def test_calibration_fit_recovers_a_known_profile() -> None:
    model, base = catalog.model("tiny"), catalog.accelerator("cpu-tiny")
    truth = make_perf(base, model, 1)
    points = [(b, b * c) for b in (1, 4, 16, 32) for c in (48, 200)]
    samples = [StepSample(b, ctx, truth.decode_step_time(b, ctx), 2) for b, ctx in points]
    got = fit(samples, model, base)
    assert got.rms_rel_error < 0.02
    assert got.step_overhead_s == pytest.approx(base.step_overhead_s, rel=0.2)


def test_cpu_pair_simulates_on_cpu_tiny() -> None:
    r = sim(builtin_scenario("cpu-pair"), "cadence")
    assert r["trajectories_completed"] == 96 and set(r["per_accelerator"]) == {"cpu-tiny"}
    assert 10 < r["sim_time_s"] < 600  # a real pair finishes it in about a minute
