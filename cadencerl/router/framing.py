"""A relayed SSE stream cut at event boundaries, so that what the client has is always whole events.

A server's stream can break in the middle of an event (a chunk ends inside a `data:` line). Relayed
byte for byte, the client would hold half a line when the router appends its error event, and its
SSE parser would glue the two into one event whose JSON does not parse. The relay sends each chunk
up to the end of its last whole event and keeps the rest until the event is complete; vLLM writes
one whole event per chunk, so in practice nothing waits.
"""

from __future__ import annotations

_BLANK_LINES = (b"\n\n", b"\r\n\r\n", b"\r\r")    # an event ends at a blank line (any line ending)


def whole_events_end(data: bytes) -> int:
    """Where the last whole event of `data` ends (0: none ends in it)."""
    return max((i + len(sep) for sep in _BLANK_LINES if (i := data.rfind(sep)) >= 0), default=0)


class EventFramer:
    """Takes the stream's bytes as they come and gives back the whole events among them."""

    __slots__ = ("partial",)

    def __init__(self) -> None:
        self.partial = b""      # the start of an event not yet complete

    def whole(self, chunk: bytes) -> bytes:
        """The events `chunk` completes (with the start kept from before); keeps what follows them."""
        data = self.partial + chunk if self.partial else chunk
        if data.endswith(b"\n\n"):          # the usual case: one or more whole events
            self.partial = b""
            return data
        end = whole_events_end(data)
        self.partial = data[end:]
        return data[:end]
