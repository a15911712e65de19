"""slime's protocol through the router, against stub servers: SGLang's native `/generate` in SGLang's
answer shape, multi-turn by the routing key, `abort_all` mid-rollout handed back with every token and
resumed exactly, the model gateway's `/workers`. The request bodies are the ones slime builds
(THUDM/slime 624b824, `slime/rollout/sglang_rollout.py`: sampling params lines 95-106, payload
176-191, routing key header 200, answer read 206-208, abort 346-349;
`slime/backends/sglang_utils/server_control.py`: abort 34, loads 40)."""

from __future__ import annotations

import json

import httpx
import pytest
from router_stub import Fleet, settle, stub_token
from test_router_areal import _in_thread

from cadencerl.core.trajectory import State
from cadencerl.router import sglang
from cadencerl.router.requests import ApiError

pytestmark = pytest.mark.timeout(60)

PROMPT = [21, 22, 23, 24]


def slime_params(max_new_tokens: int) -> dict:
    """`GenerateState.sampling_params` (sglang_rollout.py:95-106) with slime's defaults."""
    return dict(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=max_new_tokens, stop=None, stop_token_ids=None,
                skip_special_tokens=False, no_stop_trim=True, spaces_between_special_tokens=False)


def slime_payload(prompt: list[int], max_new_tokens: int) -> dict:
    """`generate`'s payload (sglang_rollout.py:176-191)."""
    return {"sampling_params": slime_params(max_new_tokens), "return_logprob": True, "input_ids": prompt}


def expected(prompt: list[int], n: int) -> list[int]:
    context = list(prompt)
    for _ in range(n):
        context.append(stub_token(context))
    return context[len(prompt):]


def new_tokens(answer: dict) -> list[int]:
    """What slime takes from the answer (sglang_rollout.py:206-208)."""
    return [item[1] for item in answer["meta_info"]["output_token_logprobs"]]


def conserved(fleet: Fleet, n: int) -> bool:
    svc = fleet.service
    return settle(lambda: svc.state.controller.done == n and not svc.state.live and not svc.resumes.running)


# -- the translation alone ------------------------------------------------------------------------

def test_slimes_sampling_params_become_vllms() -> None:
    body = sglang.completion_body(slime_payload(PROMPT, 7))
    assert body == {"prompt": PROMPT, "max_tokens": 7, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                    "skip_special_tokens": False, "include_stop_str_in_output": True,
                    "spaces_between_special_tokens": False, "logprobs": 0, "return_tokens_as_token_ids": True,
                    "stream": False}
    assert sglang.completion_body({"text": "hi"})["max_tokens"] == sglang.MAX_NEW_TOKENS


@pytest.mark.parametrize("body, field", [({}, "input_ids"), ({"input_ids": [[1, 2]]}, "input_ids"),
                                         ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
                                         ({"input_ids": [1], "sampling_params": {"nope": 1}}, "sampling_params.nope"),
                                         ({"input_ids": [1], "stream": "yes"}, "stream")])
def test_what_cannot_be_translated_is_a_400_naming_its_field(body: dict, field: str) -> None:
    with pytest.raises(ApiError) as err:
        sglang.completion_body(body)
    assert err.value.status == 400 and err.value.param == field and field in err.value.message


def test_finish_reasons_in_sglangs_shape() -> None:
    assert sglang.finish_reason("length", None, [5, 6]) == {"type": "length", "length": 2}
    assert sglang.finish_reason("stop", None, [5, 2]) == {"type": "stop", "matched": 2}       # EOS: its id
    assert sglang.finish_reason("stop", "</s>", [5]) == {"type": "stop", "matched": "</s>"}
    assert sglang.finish_reason("abort", None, [5])["type"] == "abort"
    assert sglang.finish_reason(None, None, []) is None


# -- through the router ---------------------------------------------------------------------------

def test_generate_answers_in_sglangs_shape() -> None:
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/generate", json=slime_payload(PROMPT, 9))
        assert r.status_code == 200, r.text
        answer = r.json()
        meta = answer["meta_info"]
        assert set(answer) == {"text", "output_ids", "meta_info"}
        assert answer["output_ids"] == new_tokens(answer) == expected(PROMPT, 9)
        assert answer["text"] == "".join(f" w{t}" for t in expected(PROMPT, 9))
        assert meta["finish_reason"] == {"type": "length", "length": 9}
        assert (meta["prompt_tokens"], meta["completion_tokens"]) == (4, 9)
        assert all(item[0] == -0.5 and item[2] is None for item in meta["output_token_logprobs"])
        assert c.post("/generate", json={"input_ids": []}).json()["error"]["param"] == "input_ids"
        assert conserved(f, 1)


def test_a_streamed_generate_carries_the_text_and_ids_so_far() -> None:
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        with c.stream("POST", "/generate", json={**slime_payload(PROMPT, 5), "stream": True}) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        answers = [json.loads(e) for e in events[:-1]]
        assert [len(a["output_ids"]) for a in answers][:5] == [1, 2, 3, 4, 5]
        assert answers[-1]["output_ids"] == expected(PROMPT, 5)
        assert answers[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
        assert all(a["meta_info"]["finish_reason"] is None for a in answers[:4])
        assert conserved(f, 1)


def test_the_turns_of_one_trajectory_stay_on_their_worker() -> None:
    """Four trajectories of three turns each, the routing key slime sends (sglang_rollout.py:200): each
    turn's prompt is the last one's, its answer and a tool reply, and goes where the last one went."""
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        placed: dict[str, list[str]] = {}
        contexts = {f"traj-{i}": [30 + i, 31, 32] for i in range(4)}
        for turn in range(3):
            for key, context in contexts.items():
                r = c.post("/generate", json=slime_payload(context, 6), headers={"X-SMG-Routing-Key": key})
                assert r.status_code == 200, r.text
                assert r.json()["output_ids"] == expected(context, 6)
                placed.setdefault(key, []).append(r.headers["x-cadencerl-worker"])
                context += r.json()["output_ids"] + [900 + turn]          # the tool's reply
        assert all(len(set(workers)) == 1 for workers in placed.values()), placed
        svc = f.service
        assert settle(lambda: len(svc.state.parked) == 4 and set(svc.state.live) == set(svc.state.parked))
        for key in contexts:          # the trainer is done with them: each ends, none is lost
            assert c.delete(f"/v1/sessions/{key}").json() == {"ended": True}
        assert conserved(f, 4)


def test_abort_all_mid_rollout_hands_back_every_token_and_the_resend_resumes() -> None:
    """slime's abort (sglang_rollout.py:346-349, server_control.py:34-40): GET /workers, then
    `abort_all` at each listed worker until its loads are 0; with partial rollout it re-sends each
    sample's prompt + tokens for what is left. Nothing is lost: every sample ends with its exact tokens."""
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for s in f.states:
            s.token_delay_s = 0.02
        prompts = [[40 + i, 41, 42] for i in range(4)]
        running = [_in_thread(lambda p=p: c.post("/generate", json=slime_payload(p, 80))) for p in prompts]
        svc = f.service
        assert settle(lambda: len(svc.resumes.running) == 4 and all(
            t.tokens >= 3 for t in svc.state.controller.trajectories.values()))
        trajectories = list(svc.state.controller.trajectories.values())
        workers = c.get("/workers").json()["workers"]
        assert len(workers) == 2 and {w["upstream_url"] for w in workers} == {s.url for s in f.stubs}
        for w in workers:
            assert httpx.post(f"{w['url']}/abort_request", json={"abort_all": True}).json()["success"]
        assert settle(lambda: all(httpx.get(f"{w['url']}/v1/loads?include=core").json()["loads"][0]
                                  ["num_running_reqs"] == 0 for w in workers))
        for (thread, out), prompt in zip(running, prompts):
            thread.join(10)
            answer = out[0].json()
            got = new_tokens(answer)
            assert answer["meta_info"]["finish_reason"]["type"] == "abort" and 0 < len(got) < 80
            assert got == answer["output_ids"] == expected(prompt, len(got))
            assert (answer["meta_info"]["prompt_tokens"], answer["meta_info"]["completion_tokens"]) == (3, len(got))
            r = c.post("/generate", json=slime_payload(prompt + got, 80 - len(got)))   # partial rollout's re-send
            assert r.json()["meta_info"]["finish_reason"]["type"] == "length"
            assert got + r.json()["output_ids"] == expected(prompt, 80)
        assert conserved(f, 4)
        # one trajectory each, resumed where it was (an abort is no move): 80 tokens, done
        assert [t.tokens for t in trajectories] == [80] * 4 and all(t.state is State.DONE for t in trajectories)


def test_abort_by_rid_hands_back_that_request_only() -> None:
    with Fleet(policy="cadence") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for s in f.states:
            s.token_delay_s = 0.02
        a = _in_thread(lambda: c.post("/generate", json={**slime_payload([50, 1], 40), "rid": "a"}))
        b = _in_thread(lambda: c.post("/generate", json={**slime_payload([51, 1], 40), "rid": "b"}))
        assert settle(lambda: len(f.service.resumes.running) == 2)
        assert c.post("/abort_request", json={"rid": "a"}).json() == {"success": True, "aborted": 1}
        assert c.post("/abort_request", json={}).json()["error"]["param"] == "rid"
        for (thread, out), reason, rid in ((a, "abort", "a"), (b, "length", "b")):
            thread.join(10)
            assert out[0].json()["meta_info"]["finish_reason"]["type"] == reason
            assert out[0].json()["meta_info"]["id"] == rid
        assert settle(lambda: f.service.state.controller.done == 1)     # b; a waits for its re-send
        got = new_tokens(a[1][0].json())
        r = c.post("/generate", json={**slime_payload([50, 1] + got, 40 - len(got)), "rid": "a2"})
        assert got + r.json()["output_ids"] == expected([50, 1], 40)
        assert conserved(f, 2)


def test_workers_register_and_leave_as_the_model_gateway_does() -> None:
    with Fleet(policy="cadence", admin_token=None) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        url = f.stubs[0].url
        r = c.post("/workers", json={"url": url, "worker_type": "regular"})      # slime's engine, once more
        assert r.status_code == 200 and r.json()["worker_id"] == "0"
        assert c.post("/workers", json={"url": "ftp://x"}).json()["error"]["param"] == "url"
        assert c.delete("/workers/1").json()["removed"] is True
        assert [w["upstream_url"] for w in c.get("/workers").json()["workers"]] == [url]
        assert c.delete("/workers/7").status_code == 404
        assert c.post("/generate", json=slime_payload(PROMPT, 3)).headers["x-cadencerl-worker"] == "0"
        assert conserved(f, 1)
