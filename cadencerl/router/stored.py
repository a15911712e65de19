"""Which server holds each stored response, learned from the answers as they pass.

vLLM keeps a Responses API answer on the server that made it (when the request's `store` is not
false and the server stores at all), and only that server can continue it (`previous_response_id`),
return it (`GET /v1/responses/{id}`) or cancel it. The router reads the id from the answer: a JSON
body's `id`, or in a stream the first event that carries the response object (`response.created`),
read as the chunks go by, never holding one back. The map is bounded: the oldest ids are forgotten
first, and a forgotten id is answered as an unknown one (404), never sent to a server at random.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field

MAX_EVENT_BYTES = 1 << 20     # a stream whose first events carry no id within this much is not read further


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

    def watch(self, worker: int) -> "StreamWatch":
        return StreamWatch(self, worker)


class StreamWatch:
    """Reads a relayed SSE stream's chunks until an event carries the response object's id."""

    def __init__(self, owners: ResponseOwners, worker: int) -> None:
        self._owners, self._worker = owners, worker
        self._partial = b""

    def feed(self, chunk: bytes) -> bool:
        """Read one chunk (a copy; the relay sends the chunk itself); True once done (learned, or given up)."""
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b"data:") and (found := _response_id(line[5:])) is not None:
                self._owners.add(found, self._worker)
                return True
        return len(self._partial) > MAX_EVENT_BYTES


def _response_id(data: bytes) -> str | None:
    """The response object's id in one event's data (`{"type": "response.created", "response": {"id": ...}}`)."""
    try:
        event = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    response = event.get("response") if isinstance(event, dict) else None
    found = response.get("id") if isinstance(response, dict) else None
    return found if isinstance(found, str) and found else None
