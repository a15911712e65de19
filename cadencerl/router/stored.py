"""Which server holds each stored response, and how much context it holds for it, learned from the
answers as they pass.

vLLM keeps a Responses API answer on the server that made it, and only that server can continue,
return or cancel it. The router reads the id from the answer as it passes (never holding a chunk
back) and keeps the context the server holds for it, which a continuing turn adds to its input. The
map is bounded: a forgotten id is answered as unknown (404). Details: docs/internals.md, "router".
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import quote

MAX_EVENT_BYTES = 1 << 20     # a stream line longer than this is not read
LAST_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


@dataclass
class ResponseOwners:
    """A bounded map response id -> (worker id, context tokens), oldest forgotten first."""

    limit: int
    _owner: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._owner)

    def add(self, response_id: str, worker: int, context: int = 0) -> None:
        self._owner[response_id] = (worker, context)
        self._owner.move_to_end(response_id)
        while len(self._owner) > self.limit:
            self._owner.popitem(last=False)

    def get(self, response_id: str) -> int | None:
        found = self._owner.get(response_id)
        return None if found is None else found[0]

    def context(self, response_id: str) -> int:
        """Tokens of context the server holds for the response (0 for an id the router does not know)."""
        found = self._owner.get(response_id)
        return 0 if found is None else found[1]

    def set_context(self, response_id: str, context: int) -> None:
        """Update a known id's context (one already forgotten stays forgotten)."""
        found = self._owner.get(response_id)
        if found is not None:
            self._owner[response_id] = (found[0], context)

    def learn(self, content: bytes, worker: int, prompt: int = 0) -> None:
        """Remember the id of a JSON answer (a response object), if it has one, with its context;
        `prompt`: the turn's prompt as the router sized it, for an answer without usage."""
        try:
            body = json.loads(content)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return
        if isinstance(body, dict) and isinstance(body.get("id"), str) and body["id"]:
            input_tokens, output_tokens = usage_tokens(body)
            self.add(body["id"], worker, held_context(input_tokens, output_tokens, prompt, output_tokens or 0))


def response_path(response_id: str) -> str:
    """Where a server serves a stored response (`GET`; `/cancel` after it), the id escaped."""
    return f"/v1/responses/{quote(response_id, safe='')}"


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_tokens(response: dict) -> tuple[int | None, int | None]:
    """A response object's `usage.input_tokens` and `usage.output_tokens`, each None unless a count."""
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))


def held_context(input_tokens: int | None, output_tokens: int | None, prompt: int, generated: int) -> int:
    """The context a server holds for a response: its usage's input and output tokens (the input
    counts the earlier turns it continues), else the router's own count, prompt and generated."""
    if input_tokens is not None and output_tokens is not None:
        return input_tokens + output_tokens
    return prompt + generated


class ResponseStream:
    """Reads a relayed Responses SSE stream's chunks as they pass (copies; the relay sends the chunks
    themselves): the response object's id, learned from the first event that carries it (when
    `owners`), and the tokens generated: the last `usage.output_tokens` a response object carried
    (`response.completed`, `.incomplete`, `.failed`), else, for a stream that broke before its end,
    one per `*.delta` event. Counting every event, as for completions, would count the stream's
    framing too (`response.created`, `.in_progress`, `.output_item.added`, ...: eight events for a
    one-token reply from vLLM). Each response object also updates the context remembered with the
    id (`prompt`: the turn's prompt as the router sized it, for one without usage). A line longer
    than MAX_EVENT_BYTES is skipped, not buffered. It has `ended` once the event that ends the
    stream went by (LAST_EVENTS: a Responses stream has no `[DONE]`; an over-long one is known by
    its `event:` line). A stream that breaks ends with
    `error_event`."""

    def __init__(self, owners: ResponseOwners | None, worker: int, prompt: int = 0) -> None:
        self._owners, self._worker, self._prompt = owners, worker, prompt
        self._id: str | None = None
        self._partial = b""
        self._skip = False       # the rest of an over-long line is still to come
        self._deltas = 0
        self._usage: int | None = None
        self._sequence = -1      # the last event's `sequence_number`
        self._name = ""          # the last `event:` line's
        self.ended = False

    @property
    def generated(self) -> int:
        return self._usage if self._usage is not None else self._deltas

    @property
    def response_id(self) -> str | None:
        """The stored response's id, once an event carried it (None when not remembered)."""
        return self._id

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if self._skip:          # an over-long event's last part: its `event:` line names it
                self._skip = False
                self.ended = self.ended or self._name in LAST_EVENTS
            elif line.startswith(b"data:"):
                self._event(line[5:])
            elif line.startswith(b"event:"):
                self._name = line[6:].strip().decode("utf-8", "replace")
        if len(self._partial) > MAX_EVENT_BYTES:
            self._partial, self._skip = b"", True

    def error_event(self, message: str) -> bytes:
        """The Responses API's streaming error event (`event: error`, a `ResponseErrorEvent`),
        numbered after the last event relayed; a Responses stream has no `data: [DONE]`."""
        body = {"type": "error", "code": "upstream_error", "message": message, "param": None,
                "sequence_number": self._sequence + 1}
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"

    def _event(self, data: bytes) -> None:
        try:
            event = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return      # `[DONE]`, or not JSON: nothing to read
        if not isinstance(event, dict):
            return
        kind, sequence = event.get("type"), event.get("sequence_number")
        if isinstance(sequence, int) and not isinstance(sequence, bool):
            self._sequence = sequence
        if isinstance(kind, str) and kind.endswith(".delta"):
            self._deltas += 1
        self.ended = self.ended or (isinstance(kind, str) and kind in LAST_EVENTS)
        response = event.get("response")
        if isinstance(response, dict):
            self._response(response)

    def _response(self, response: dict) -> None:
        input_tokens, output_tokens = usage_tokens(response)
        if output_tokens is not None:
            self._usage = output_tokens
        if self._owners is None:
            return
        context = held_context(input_tokens, output_tokens, self._prompt, self.generated)
        found = response.get("id")
        if self._id is None and isinstance(found, str) and found:
            self._id = found
            self._owners.add(found, self._worker, context)
        elif self._id is not None:
            self._owners.set_context(self._id, context)
