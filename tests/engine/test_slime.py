"""slime's requests through `cadencerl router --policy cadence` over two vLLM CPU servers.

The bodies are the ones slime builds (THUDM/slime 624b824, `slime/rollout/sglang_rollout.py`
95-106 and 176-200; its abort, 346-349 and `slime/backends/sglang_utils/server_control.py` 34-40):
`/generate` answers what vLLM generates for the same request, in SGLang's shape (greedy, so the
two are comparable; a length and a stop finish); the turns of a routing key stay on their worker;
`abort_all` mid-rollout hands a running sample back with its tokens, its re-send completes it, and
the router's books balance (the sample ends once).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from cadencerl.devpool.local_pool import LocalPool
from cadencerl.engine.server_metrics import series_total

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]


def payload(prompt: list[int], n: int, **params) -> dict:
    sampling = dict(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=n, stop=None, stop_token_ids=None,
                    skip_special_tokens=False, no_stop_trim=True, spaces_between_special_tokens=False)
    return {"sampling_params": {**sampling, **params}, "return_logprob": True, "input_ids": prompt}


def ids_of(answer: dict) -> list[int]:
    return [item[1] for item in answer["meta_info"]["output_token_logprobs"]]


@pytest.fixture
def router(engine_pool: LocalPool):
    proc = subprocess.Popen([sys.executable, "-m", "cadencerl.cli", "router", "--workers", ",".join(engine_pool.urls),
                             "--policy", "cadence", "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        address = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert address, line
        threading.Thread(target=_echo, args=(proc.stderr,), daemon=True).start()
        _wait(lambda: _ready(address.group(1)), "the router ready")
        yield address.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_slime_through_the_router(engine_pool: LocalPool, router: str) -> None:
    c = httpx.Client(base_url=router, timeout=120)
    prompt = [11, 12, 13, 14, 15, 16]
    # the same request, greedy, through the router and straight to vLLM
    r = c.post("/generate", json=payload(prompt, 16, temperature=0.0, ignore_eos=True))
    assert r.status_code == 200, r.text
    answer = r.json()
    direct = httpx.post(f"{engine_pool.urls[0]}/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": 16, "temperature": 0.0, "logprobs": 0, "return_tokens_as_token_ids": True,
        "ignore_eos": True}).json()["choices"][0]
    want = [int(t.removeprefix("token_id:")) for t in direct["logprobs"]["tokens"]]
    assert answer["output_ids"] == ids_of(answer) == want and answer["text"] == direct["text"]
    meta = answer["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 16}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (6, 16)
    stop = c.post("/generate", json=payload(prompt, 16, temperature=0.0, ignore_eos=True,
                                            stop_token_ids=[want[2]])).json()
    assert stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": want[2]}
    assert stop["output_ids"] == want[:want.index(want[2]) + 1]

    # multi-turn, the routing key: each trajectory's turns on one worker
    placed: dict[str, set[str]] = {}
    contexts = {f"traj-{i}": [100 + i, 7, 8] for i in range(4)}
    for turn in range(2):
        for key, context in contexts.items():
            r = c.post("/generate", json=payload(context, 8, ignore_eos=True), headers={"X-SMG-Routing-Key": key})
            placed.setdefault(key, set()).add(r.headers["x-cadencerl-worker"])
            context += r.json()["output_ids"] + [42]
    assert all(len(workers) == 1 for workers in placed.values()), placed
    for key in contexts:
        assert c.delete(f"/v1/sessions/{key}").json() == {"ended": True}

    # abort_all mid-rollout, as slime aborts; partial rollout re-sends what is left (within the
    # router's session TTL). One long sample: with two, CadenceRL may run them one after the other on
    # the server it measured faster (seen in a full run: the other server idle for a minute), and
    # abort_all hands back the running ones only. A round the machine outran (the sample ended before
    # the abort came, or had no token yet) is tried again with a prompt of its own.
    n = 8000
    workers = c.get("/workers").json()["workers"]
    assert sorted(w["upstream_url"] for w in workers) == sorted(engine_pool.urls)

    def loads() -> int:
        return sum(c.get(f"{w['url']}/v1/loads").json()["loads"][0]["num_running_reqs"] for w in workers)

    def running() -> int:     # asked again once if a kept-alive connection met the server's idle close
        try:
            return loads()
        except httpx.TransportError:
            return loads()

    def generate(body: dict) -> dict:
        return c.post("/generate", json=body).json()
    background = ThreadPoolExecutor(1)          # the sample runs while this thread aborts it
    for attempt in range(4):
        before = c.get("/metrics").text
        prompt = [200 + attempt, 3, 4, 5]
        answer = background.submit(generate, payload(prompt, n, ignore_eos=True))
        _wait(lambda: running() == 1, "the sample running", state=lambda: c.get("/health").json())
        time.sleep(0.1)                         # mid-rollout: tokens flowing
        for w in workers:
            assert c.post(f"{w['url']}/abort_request", json={"abort_all": True}).json()["success"]
        _wait(lambda: running() == 0, "idle after abort_all")
        first = answer.result(120)
        got = ids_of(first)
        if first["meta_info"]["finish_reason"]["type"] == "abort" and got:
            break
    background.shutdown()
    assert first["meta_info"]["finish_reason"]["type"] == "abort" and 0 < len(got) < n, first["meta_info"]
    assert got == first["output_ids"] and first["meta_info"]["completion_tokens"] == len(got)
    rest = generate(payload(prompt + got, n - len(got), ignore_eos=True))
    assert rest["meta_info"]["finish_reason"] == {"type": "length", "length": n - len(got)}
    metrics = c.get("/metrics").text
    delta = lambda name: series_total(metrics, name) - series_total(before, name)    # noqa: E731
    assert delta("cadencerl_router_handed_back_total") == 1 and delta("cadencerl_router_resumed_total") == 1
    assert delta("cadencerl_router_completed_sessions") == 1        # the sample ended once, resumed
    print(f"slime abort_all: handed back {len(got)} tokens of {n}, resumed")


def _echo(stream) -> None:
    """What the router says after its first line, on to this test's stderr (shown with a failure):
    never left in a pipe that, full, would stop the router."""
    for line in stream:
        sys.stderr.write(f"router: {line}")


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readiness", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(check, what: str, timeout_s: float = 60.0, state=lambda: "") -> None:
    """Until `check()`; a failure names what was awaited and the router's `state()` then."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not seen within {timeout_s} s: {what} {state()}"
        time.sleep(0.05)
