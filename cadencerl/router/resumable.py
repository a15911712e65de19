"""A resumable request's relay: streamed from its server, answered whole, cut short by an eviction.

The client (AReaL's `RemotevLLMEngine`) asks for one completion of a token-id prompt, answered
whole. The router asks the server for the same as a stream, so that it counts the tokens as they
come (the policy sees the context grow) and, when the policy evicts the trajectory, closes the
stream (vLLM aborts the request) and answers what came so far with `finish_reason: "abort"`, in
vLLM's shape. The client re-sends prompt + those tokens; the router matches it (`resume_group`)
to the trajectory waiting in the pending set, and it runs where the policy places it.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from starlette.responses import Response

from cadencerl.core.trajectory import State
from cadencerl.router.live import Session
from cadencerl.router.requests import ApiError, Routed, read_json
from cadencerl.router.service import RouterService

_TOKEN_ID = "token_id:"


def upstream_body(raw: bytes) -> bytes:
    """The request as the router sends it: streamed, with the usage in its last event."""
    body = read_json(raw)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


class Reply:
    """One completion choice, gathered from its stream's events, answered as vLLM answers it whole."""

    def __init__(self) -> None:
        self.head: dict = {}
        self.text: list[str] = []
        self.tokens: list[str] = []
        self.token_logprobs: list = []
        self.top_logprobs: list = []
        self.finish_reason: str | None = None
        self.stop_reason = None
        self.prompt_tokens = 0

    def feed(self, event: dict) -> int:
        """One event; the tokens it brought."""
        if not self.head:
            self.head = {k: event[k] for k in ("id", "created", "model") if k in event}
        if usage := event.get("usage"):
            self.prompt_tokens = usage.get("prompt_tokens") or self.prompt_tokens
        before = len(self.tokens)
        for choice in event.get("choices") or ():
            self.text.append(choice.get("text") or "")
            logprobs = choice.get("logprobs") or {}
            self.tokens += logprobs.get("tokens") or []
            self.token_logprobs += logprobs.get("token_logprobs") or []
            self.top_logprobs += logprobs.get("top_logprobs") or []
            if choice.get("finish_reason") is not None:
                self.finish_reason, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        return len(self.tokens) - before

    def token_ids(self) -> list[int]:
        return [int(t.removeprefix(_TOKEN_ID)) for t in self.tokens]

    def body(self, finish_reason: str) -> bytes:
        n = len(self.tokens)
        choice = {"index": 0, "text": "".join(self.text),
                  "logprobs": {"text_offset": [], "token_logprobs": self.token_logprobs, "tokens": self.tokens,
                               "top_logprobs": self.top_logprobs or None},
                  "finish_reason": finish_reason, "stop_reason": self.stop_reason if finish_reason != "abort" else None}
        return json.dumps({"id": self.head.get("id", "cmpl-cadencerl"), "object": "text_completion",
                           "created": self.head.get("created", int(time.time())), "model": self.head.get("model", ""),
                           "choices": [choice], "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
                                                          "total_tokens": self.prompt_tokens + n}}).encode()


async def _read(svc: RouterService, session: Session, resp: httpx.Response, reply: Reply) -> None:
    """The stream's events into `reply`, each one's tokens counted on the trajectory as it comes."""
    buffer = b""
    async for chunk in resp.aiter_raw():
        buffer += chunk
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            data = event.strip()
            if not data.startswith(b"data:") or data == b"data: [DONE]":
                continue
            svc.progress(session, reply.feed(json.loads(data[5:])))


async def answer(svc: RouterService, session: Session, resp: httpx.Response, req: Routed,
                 headers: list[tuple[bytes, bytes]]) -> Response:
    """The whole answer, or what came before an eviction: that, with finish_reason "abort"."""
    reply = Reply()
    evicted = svc.resumes.start(session)
    reading = asyncio.ensure_future(_read(svc, session, resp, reply))
    waiting = asyncio.ensure_future(evicted.wait())
    try:
        await asyncio.wait((reading, waiting), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        if not reading.done():
            reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await resp.aclose()            # a stream closed early: vLLM aborts the request
    failure = None if reading.cancelled() else reading.exception()
    finished = failure is None and not reading.cancelled() and reply.finish_reason is not None
    if finished:
        svc.resumes.ended(session)
        if session.traj.state is State.PENDING:     # evicted as its last token came: finished all the same
            svc.state.finished(session, 0, svc.now())
            svc.decide()
        else:
            svc.release(session, 0, last=req.last)
    elif failure is not None and not reply.tokens:
        svc.resumes.ended(session)
        svc.release(session, 0, last=req.last)
        raise ApiError(502, f"upstream stream failed ({type(failure).__name__})", kind="upstream_error")
    else:                               # evicted, or its stream broke: the client resumes what it got
        why = svc.resumes.handed_back(session, req.prompt_ids, reply.token_ids(), svc.now())
        svc.metrics.handed_back.labels(why).inc()
    out = Response(reply.body(reply.finish_reason if finished else "abort"), media_type="application/json")
    out.raw_headers.extend((k, v) for k, v in headers if k.lower() != b"content-type")
    return out
