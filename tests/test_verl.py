"""verl (0.9.1) through the router, against stub servers. verl's call shapes replayed in this
suite's interpreter: the agent loop's `generate(request_id, prompt_ids=, sampling_params=)` with the
sampling params `AgentLoopWorker` builds (`verl/experimental/agent_loop/agent_loop.py`, 590-596),
the load balancer's calls as `LLMServerClient` and `LLMServerManager` make them (`llm_server.py`
70-88, `router.py` 170-253), its YAML plugin's constructor (`router.py` 391); then verl's own
classes (its plugin factory, client, manager loader, TokenOutput) in `engine/verl_client.py`, under
vLLM's interpreter (verl imports torch) with the verl extra `make test` installs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from router_stub import FAST, Fleet, StubState, settle, stub_app
from server_thread import ServerThread
from test_router_areal import _in_thread, _on_router

from cadencerl.core.actions import Evict
from cadencerl.integrations import verl as cv

pytestmark = pytest.mark.timeout(60)


def verl_config(url: str) -> SimpleNamespace:
    rollout = {"response_length": 12, "prompt_length": 64, "cadencerl_router_url": url}
    return SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout))


def agent_loop_params() -> dict:
    """`AgentLoopWorker.generate_sequences`'s sampling params (agent_loop.py:590-596)."""
    return dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)


def expected(prompt: list[int], n: int) -> list[int]:
    from test_router_sglang import expected as stub_expected
    return stub_expected(prompt, n)


def served(fleet: Fleet) -> list[int]:
    return [sum(s.served.values()) for s in fleet.states]


def test_generate_goes_through_the_router_and_answers_verls_token_output() -> None:
    with Fleet(policy="cadence") as f:
        client = cv.CadenceRLServerClient(config=verl_config(f.url), load_balancer_handle=None)
        out = asyncio.run(client.generate("traj-1", prompt_ids=[5, 6, 7], sampling_params=agent_loop_params()))
        assert out.token_ids == expected([5, 6, 7], 12) and out.stop_reason == "completed"
        assert out.log_probs == [-0.5] * 12 and out.num_preempted == 0
        no_lp = asyncio.run(client.generate("traj-2", prompt_ids=[5], sampling_params={"max_tokens": 3}))
        assert len(no_lp.token_ids) == 3 and no_lp.log_probs is None
        svc = f.service
        assert settle(lambda: len(svc.state.parked) == 2)      # a session each, parked for its next turn
        for key in ("traj-1", "traj-2"):
            assert httpx.delete(f"{f.url}/v1/sessions/{key}").json() == {"ended": True}
        assert settle(lambda: svc.state.controller.done == 2 and not svc.state.live)


def test_the_turns_of_one_request_id_stay_on_one_server() -> None:
    with Fleet(policy="cadence") as f:
        client = cv.CadenceRLServerClient(config=verl_config(f.url))

        async def trajectory(request_id: str, prompt: list[int]) -> None:
            for turn in range(3):
                out = await client.generate(request_id, prompt_ids=prompt, sampling_params=agent_loop_params())
                prompt = prompt + out.token_ids + [700 + turn]
        for i in range(2):
            before = served(f)
            asyncio.run(trajectory(f"traj-{i}", [60 + i, 1]))
            grew = [a - b for a, b in zip(served(f), before)]
            assert sorted(grew) == [0, 3], grew
        for i in range(2):          # the trainer is done with them: each ends once
            assert httpx.delete(f"{f.url}/v1/sessions/traj-{i}").json() == {"ended": True}
        svc = f.service
        assert settle(lambda: svc.state.controller.done == 2 and not svc.state.live)


def test_a_request_the_router_evicts_is_resent_with_its_tokens_and_ends_whole() -> None:
    with Fleet(policy="cadence") as f:
        for s in f.states:
            s.token_delay_s = 0.02
        client = cv.CadenceRLServerClient(config=verl_config(f.url))
        params = {**agent_loop_params(), "max_tokens": 60}
        thread, out = _in_thread(lambda: asyncio.run(client.generate("t", prompt_ids=[9, 9], sampling_params=params)))
        svc = f.service
        assert settle(lambda: any(t.tokens >= 5 for t in svc.state.controller.trajectories.values()))
        traj = next(iter(svc.state.controller.trajectories.values()))
        _on_router(f, lambda: svc.state.controller.apply(Evict(traj.id), svc.now()))
        thread.join(20)
        answer = out[0]
        assert answer.token_ids == expected([9, 9], 60) and answer.num_preempted == 1
        assert answer.stop_reason == "completed" and len(answer.log_probs) == 60
        assert traj.tokens == 60 and traj.placements == 2          # one trajectory, resumed


def test_the_load_balancer_keeps_the_routers_workers_in_step_with_verls_servers() -> None:
    extra = ServerThread(stub_app(StubState("extra")), name="extra", **FAST).start()
    try:
        with Fleet(policy="cadence", admin_token=None) as f:
            address = extra.url.removeprefix("http://")
            # verl's YAML plugin: cls(servers, yaml_config) (router.py:391)
            lb = cv.CadenceRLLoadBalancer({f.stubs[0].url: None}, {"router_class": "x", "router_url": f.url})
            assert lb.require_acquire_fields() == [] and lb.require_release_fields() == ["request_id"]
            lb.add_servers({address: "handle"})
            listed = httpx.get(f"{f.url}/workers").json()["workers"]
            assert extra.url in [w["upstream_url"] for w in listed] and len(listed) == 3
            assert lb.acquire_server(request_id="r1") == (cv.ROUTER_ID, f.url)
            assert lb.acquire_server(request_id="r1")[0] == cv.ROUTER_ID and lb.get_total_inflight() == 2
            lb.release_server(cv.ROUTER_ID, request_id="r1")
            lb.release_server(cv.ROUTER_ID, request_id="r1")
            assert lb.get_total_inflight() == 0
            lb.remove_servers([address])
            assert len(httpx.get(f"{f.url}/workers").json()["workers"]) == 2
            assert lb.get_all_servers() == [f.stubs[0].url]
    finally:
        extra.stop()


def test_a_missing_router_address_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cv.ROUTER_URL_ENV, raising=False)
    with pytest.raises(ValueError, match="cadencerl_router_url"):
        cv.CadenceRLServerClient(config=None)
    with pytest.raises(ValueError, match="router_url"):
        cv.CadenceRLLoadBalancer({}, {})
    with pytest.raises(ValueError, match="max_tokens"):
        cv.max_tokens({}, 3, {})


VERL_PATH_ENV = "CADENCERL_VERL_PATH"      # the folder `make test` installs the verl extra into
CLIENT = Path(__file__).parent / "engine" / "verl_client.py"


def verl_pythonpath() -> tuple[str, str]:
    """vLLM's interpreter (verl needs torch) and a PYTHONPATH with verl, AReaL's extra (Ray,
    OmegaConf) and this checkout; the test skips, saying why, where `make test` did not install them."""
    python, verl, areal = (os.environ.get(k) for k in ("CADENCERL_VLLM_PYTHON", VERL_PATH_ENV, "CADENCERL_AREAL_PATH"))
    if not (python and verl and areal and (Path(verl) / "verl").is_dir() and (Path(areal) / "ray").is_dir()):
        pytest.skip(f"verl is not installed: set CADENCERL_VLLM_PYTHON, {VERL_PATH_ENV} and CADENCERL_AREAL_PATH "
                    "to what `make test` installs (.venv-engine, .venv-verl, .venv-areal)")
    return python, os.pathsep.join([verl, areal, str(Path(__file__).parents[1])])


@pytest.mark.timeout(240)
def test_verls_own_classes_route_through_the_router(tmp_path: Path) -> None:
    """verl's plugin factory, its client's acquire/release, its manager loader and TokenOutput."""
    python, pythonpath = verl_pythonpath()
    joined = StubState("extra")              # a server verl launched: it joins through the plugin
    extra = ServerThread(stub_app(joined), name="extra", **FAST).start()
    try:
        with Fleet(policy="cadence", admin_token=None) as f:
            plugin = tmp_path / "cadencerl-router.yaml"
            plugin.write_text(f"router_class: cadencerl.integrations.verl.CadenceRLLoadBalancer\nrouter_url: {f.url}\n")
            out = tmp_path / "result.json"
            address = extra.url.removeprefix("http://")
            run = subprocess.run([python, str(CLIENT), "--router", f.url, "--register", address, "--yaml", str(plugin),
                                  "--out", str(out)], env={**os.environ, "PYTHONPATH": pythonpath},
                                 capture_output=True, text=True, timeout=200)
            assert run.returncode == 0, run.stderr[-3000:]
            got = json.loads(out.read_text())
            assert got["acquired"] == [cv.ROUTER_ID, f.url, 1]
            assert got["status"] == {"router": f.url, "servers": [address], "inflight": 0}
            assert got["router_workers"] == [*(s.url for s in f.stubs), extra.url]   # verl's server joined
            assert got["manager_is_verls"] and got["client"] == "CadenceRLServerClient" and got["client_url"] == f.url
            for i, turns in enumerate(got["trajectories"]):
                prompt = [60 + i, 1]
                for turn in turns:
                    assert turn["prompt"] == prompt and turn["tokens"] == expected(prompt, 12)
                    assert turn["log_probs"] == [-0.5] * 12 and turn["stop_reason"] == "completed"
                    assert turn["verl_token_output"]
                    prompt = prompt + turn["tokens"] + [700]
            per_server = sorted(sum(s.served.values()) for s in [*f.states, joined])
            assert per_server in ([0, 3, 3], [0, 0, 6]), per_server     # each trajectory's turns on one server
            assert [w["upstream_url"] for w in httpx.get(f"{f.url}/workers").json()["workers"]] == [s.url for s in f.stubs]
            for i in range(2):          # the trainer is done with them: each ends once
                assert httpx.delete(f"{f.url}/v1/sessions/traj-{i}").json() == {"ended": True}
            svc = f.service
            assert settle(lambda: svc.state.controller.done == 2 and not svc.state.live)
    finally:
        extra.stop()
