"""Which server holds each stored response, learned from the answers as they pass.

vLLM keeps a Responses API answer on the server that made it (when the request's `store` is not
false and the server stores at all), and only that server can continue it (`previous_response_id`),
return it (`GET /v1/responses/{id}`) or cancel it. The router reads the id from the answer: a JSON
body's `id`, or in a stream the first event that carries the response object (`response.created`),
read as the chunks go by, never holding one back (the same reader counts the stream's tokens). The
map is bounded: the oldest ids are forgotten first, and a forgotten id is answered as an unknown one
(404), never sent to a server at random.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field

MAX_EVENT_BYTES = 1 << 20     # a stream line longer than this is not read


@dataclass
class ResponseOwners:
    """A bounded map response id -> worker id, oldest forgotten first."""

    limit: int
    _owner: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._owner)

    def add(self, response_id: str, worker: int) -> None:
        self._owner[response_id] = worker
        self._owner.move_to_end(response_id)
        while len(self._owner) > self.limit:
            self._owner.popitem(last=False)

    def get(self, response_id: str) -> int | None:
        return self._owner.get(response_id)

    def learn(self, content: bytes, worker: int) -> None:
        """Remember the id of a JSON answer (a response object), if it has one."""
        try:
            body = json.loads(content)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return
        if isinstance(body, dict) and isinstance(body.get("id"), str) and body["id"]:
            self.add(body["id"], worker)


class ResponseStream:
    """Reads a relayed Responses SSE stream's chunks as they pass (copies; the relay sends the chunks
    themselves): the response object's id, learned from the first event that carries it (when
    `owners`), and the tokens generated: the last `usage.output_tokens` a response object carried
    (`response.completed`, `.incomplete`, `.failed`), else, for a stream that broke before its end,
    one per `*.delta` event. Counting every event, as for completions, would count the stream's
    framing too (`response.created`, `.in_progress`, `.output_item.added`, ...: eight events for a
    one-token reply from vLLM). A line longer than MAX_EVENT_BYTES is skipped, not buffered."""

    def __init__(self, owners: ResponseOwners | None, worker: int) -> None:
        self._owners, self._worker = owners, worker
        self._partial = b""
        self._skip = False       # the rest of an over-long line is still to come
        self._deltas = 0
        self._usage: int | None = None

    @property
    def generated(self) -> int:
        return self._usage if self._usage is not None else self._deltas

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if self._skip:
                self._skip = False
            elif line.startswith(b"data:"):
                self._event(line[5:])
        if len(self._partial) > MAX_EVENT_BYTES:
            self._partial, self._skip = b"", True

    def _event(self, data: bytes) -> None:
        try:
            event = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return      # `[DONE]`, or not JSON: nothing to read
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if isinstance(kind, str) and kind.endswith(".delta"):
            self._deltas += 1
        response = event.get("response")
        if not isinstance(response, dict):
            return
        found = response.get("id")
        if self._owners is not None and isinstance(found, str) and found:
            self._owners.add(found, self._worker)
            self._owners = None
        usage = response.get("usage")
        tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            self._usage = tokens
