"""A relayed SSE stream cut at event boundaries, so that what the client has is always whole events.

A server's stream can break in the middle of an event (a chunk ends inside a `data:` line). Relayed
byte for byte, the client would hold half a line when the router appends its error event, and its
SSE parser would glue the two into one event whose JSON does not parse. The relay sends each chunk
up to the end of its last whole event and keeps the rest until the event is complete; vLLM writes
one whole event per chunk, so in practice nothing waits. An event still incomplete past
MAX_EVENT_BYTES is passed on as it comes (the guarantee is given up for it, not the memory).
"""

from __future__ import annotations

import re

from cadencerl.router.stored import MAX_EVENT_BYTES

# An event ends at a blank line: two line endings in a row, each CRLF, LF or a CR alone (SSE's three).
_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")


def whole_events_end(data: bytes, start: int = 0) -> int:
    """Where the last whole event of `data` ends (0: none ends in it), searching from `start`."""
    end = 0
    for match in _BLANK_LINE.finditer(data, start):
        end = match.end()
    return end


class EventFramer:
    """Takes the stream's bytes as they come and gives back the whole events among them."""

    __slots__ = ("partial",)

    def __init__(self) -> None:
        self.partial = b""      # the start of an event not yet complete

    def whole(self, chunk: bytes) -> bytes:
        """The events `chunk` completes (with the start kept from before); keeps what follows them."""
        if not self.partial and chunk.endswith(b"\n\n"):     # the usual case: one or more whole events
            return chunk
        start = max(0, len(self.partial) - 3)           # the kept start holds no blank line but at its end
        data = self.partial + chunk
        end = whole_events_end(data, start)
        if end == 0 and len(data) > MAX_EVENT_BYTES:
            end = len(data)
        self.partial = data[end:]
        return data[:end]
