"""`app.enter_at_once`: a decision owner's way to enter a loop turn's requests before one pass;
`place`'s own way where something must come first (a pause, a stored response, a resume)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from starlette.datastructures import Headers

from cadencerl.core.trajectory import State
from cadencerl.router.app import enter_at_once
from cadencerl.router.requests import parse_request
from cadencerl.router.service import RouterService
from cadencerl.router.settings import make_settings


def _service(policy: str = "cache-aware") -> RouterService:
    svc = RouterService(make_settings(workers=["http://127.0.0.1:9", "http://127.0.0.1:10"], policy=policy))
    for w in svc.state.workers:
        w.alive = True
    return svc


def _routed(svc: RouterService, prompt: object = "hello there", **fields: object):
    raw = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 8, **fields}).encode()
    return parse_request(raw, Headers({"content-type": "application/json"}), "prompt",
                         svc.settings.classes, svc.settings.fallback_class)


def test_a_turns_requests_are_entered_then_placed_by_one_pass_and_released() -> None:
    async def turn() -> None:
        svc = _service()
        sessions = [enter_at_once(svc, _routed(svc, f"prompt {i}")) for i in range(5)]
        assert all(s is not None and s.traj.state is State.FRESH for s in sessions)   # held for the due pass
        svc.decide_now()
        assert all(s.traj.state is State.RESIDENT for s in sessions)
        svc.decide_now()                                # none due any more: nothing changes
        for s in sessions:
            svc.release(s, 8, last=True)
        assert sum(w.sessions for w in svc.state.workers) == 0 and not svc.state.live
    asyncio.run(turn())


def test_what_place_must_see_first_is_left_to_it() -> None:
    svc = _service()
    routed = _routed(svc)
    svc.paused = True
    assert enter_at_once(svc, routed) is None
    svc.paused = False
    assert enter_at_once(svc, dataclasses.replace(routed, previous_response_id="resp_1")) is None
    ids = _routed(svc, [1, 2, 3], return_tokens_as_token_ids=True, logprobs=0)   # AReaL's, resumable
    assert ids.prompt_ids is not None
    svc.resumes.evicted_at[ids.group] = []              # an evicted request waits to be re-sent
    assert enter_at_once(svc, ids) is None
    assert not svc.state.live                           # none of them entered anything
