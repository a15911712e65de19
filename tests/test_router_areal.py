"""AReaL's protocol through the router, against stub servers: token-id completions answered whole in
vLLM's shape, an eviction handed to the client as "abort" with every token so far and its re-send
resumed exactly, the pause / update / continue routes applied to every server, and clear errors for
what the router cannot do. The request bodies are the ones AReaL 1.0.4 builds
(`areal/engine/vllm_remote.py`, `VLLMBackend.build_generation_request`)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from router_stub import Fleet, settle, stub_token

from cadencerl.core.actions import ActionError, Evict
from cadencerl.core.trajectory import State

pytestmark = pytest.mark.timeout(60)

PROMPT = [11, 12, 13, 14, 15]


def areal_body(prompt: list[int], max_tokens: int) -> dict:
    """A generation request as AReaL's remote vLLM engine sends it."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "stop_token_ids": [], "ignore_eos": False, "skip_special_tokens": False, "return_tokens_as_token_ids": True,
            "logprobs": 0, "stream": False}


def expected(prompt: list[int], n: int) -> list[int]:
    context = list(prompt)
    for _ in range(n):
        context.append(stub_token(context))
    return context[len(prompt):]


def token_ids(answer: dict) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in answer["choices"][0]["logprobs"]["tokens"]]


def _in_thread(fn):
    """Run `fn` in a thread; its result (or exception) in the returned list once joined."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(_capture(fn)), daemon=True)
    thread.start()
    return thread, out


def _capture(fn):
    try:
        return fn()
    except Exception as exc:          # handed to the test, which re-raises it
        return exc


def _on_router(fleet: Fleet, fn):
    """`fn()` on the router's event loop (the service is not thread-safe), its result returned."""
    async def call():
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), fleet.service.loop).result(5)


def test_a_token_id_request_is_answered_whole_in_vllms_shape() -> None:
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/completions", json=areal_body(PROMPT, 12))
        assert r.status_code == 200, r.text
        answer = r.json()
        choice = answer["choices"][0]
        assert answer["object"] == "text_completion" and choice["finish_reason"] == "length"
        assert token_ids(answer) == expected(PROMPT, 12)
        assert len(choice["logprobs"]["token_logprobs"]) == 12
        assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
        assert settle(lambda: f.service.state.controller.done == 1 and not f.service.state.live)


def test_an_eviction_hands_back_every_token_and_the_resend_resumes_exactly() -> None:
    """The policy evicts a running request: its client gets "abort" and the tokens so far; the
    re-send (prompt + those tokens) is the same trajectory, placed again, and ends as if never cut."""
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for s in f.states:
            s.token_delay_s = 0.02
        thread, out = _in_thread(lambda: c.post("/v1/completions", json=areal_body(PROMPT, 60)))
        svc = f.service
        assert settle(lambda: any(t.tokens >= 5 for t in svc.state.controller.trajectories.values()))
        traj = next(iter(svc.state.controller.trajectories.values()))
        _on_router(f, lambda: svc.state.controller.apply(Evict(traj.id), svc.now()))
        thread.join(10)
        first = out[0].json()
        got = token_ids(first)
        assert first["choices"][0]["finish_reason"] == "abort" and 0 < len(got) < 60
        assert got == expected(PROMPT, len(got))
        assert first["usage"]["completion_tokens"] == len(got)
        r = c.post("/v1/completions", json=areal_body(PROMPT + got, 60 - len(got)))    # AReaL's re-send
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert got + token_ids(r.json()) == expected(PROMPT, 60)
        assert settle(lambda: svc.state.controller.done == 1 and not svc.state.live)
        assert traj.placements == 2 and traj.tokens == 60 and traj.state is State.DONE   # one trajectory, resumed
        metrics = c.get("/metrics").text
        assert 'cadencerl_router_handed_back_total{why="evicted"} 1.0' in metrics
        assert "cadencerl_router_resumed_total 1.0" in metrics


def test_a_client_that_does_not_resume_is_never_evicted() -> None:
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for s in f.states:
            s.token_delay_s = 0.02
        headers = {"x-cadencerl-resumable": "0"}
        thread, out = _in_thread(lambda: c.post("/v1/completions", json=areal_body(PROMPT, 30), headers=headers))
        svc = f.service
        assert settle(lambda: any(t.state is State.RESIDENT for t in svc.state.controller.trajectories.values()))
        traj = next(iter(svc.state.controller.trajectories.values()))
        with pytest.raises(ActionError, match="resum"):
            _on_router(f, lambda: svc.state.controller.apply(Evict(traj.id), svc.now()))
        thread.join(10)
        answer = out[0].json()                # relayed as the server answered it, whole
        assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 30


def test_pause_update_continue_is_applied_to_every_server() -> None:
    """AReaL's weight update: pause hands every running request back ("abort"), the update is the
    controller's next version and reaches every server through vLLM's dev-mode routes, a request
    sent meanwhile waits for the continue, and the resumed one carries both versions."""
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for s in f.states:
            s.token_delay_s = 0.02
        svc = f.service
        thread, out = _in_thread(lambda: c.post("/v1/completions", json=areal_body(PROMPT, 60)))
        assert settle(lambda: any(t.tokens >= 5 for t in svc.state.controller.trajectories.values()))
        traj = next(iter(svc.state.controller.trajectories.values()))
        assert c.post("/areal_pause_generation").json() == {"success": True}
        thread.join(10)
        got = token_ids(out[0].json())
        assert out[0].json()["choices"][0]["finish_reason"] == "abort" and 0 < len(got) < 60
        r = c.post("/areal_update_weights", json={"model_path": "/ckpt/step-1"})
        assert r.status_code == 200 and r.json() == {"success": True, "version": 1}
        for s in f.states:           # each server: pause, reload from the path, tag, resume, in order
            assert [route for route, _ in s.dev_calls] == ["/pause", "/collective_rpc", "/update_weight_version",
                                                          "/resume"]
            assert s.dev_calls[1][1]["kwargs"] == {"weights_path": "/ckpt/step-1"}
            assert s.dev_calls[2][1] == {"new_version": "1"}
        resend, later = _in_thread(lambda: c.post("/v1/completions", json=areal_body(PROMPT + got, 60 - len(got))))
        resend.join(0.5)
        assert resend.is_alive()              # paused: it waits
        assert c.post("/areal_continue_generation").json() == {"success": True}
        resend.join(10)
        assert got + token_ids(later[0].json()) == expected(PROMPT, 60)
        assert settle(lambda: svc.state.controller.done == 1 and not svc.state.live)
        assert traj.versions == [0, 1] and svc.state.controller.trainer.version == 1
        metrics = c.get("/metrics").text
        assert 'cadencerl_router_handed_back_total{why="pause"} 1.0' in metrics
        assert "cadencerl_router_weight_version 1.0" in metrics


def test_what_the_router_cannot_do_is_a_clear_error() -> None:
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/areal_init_weights_update_group", json={})
        assert r.status_code == 501 and "/areal_init_weights_update_group" in r.json()["error"]["message"]
        assert "model_path" in r.json()["error"]["message"]
        r = c.post("/areal_update_weights", json={"path": "/x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model_path"
        r = c.post("/areal_update_weights", content=b"{")
        assert r.status_code == 400
        for s in f.states:
            assert s.dev_calls == []          # nothing was pushed
