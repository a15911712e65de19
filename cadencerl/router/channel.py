"""The local channel between the router's data-path processes and its decision owner (`--processes N`).

One Unix-socket stream per data-path process, carrying messages as JSON lists, one a line. What a
loop turn sends goes out in one write at the turn's end: under load many acquires and releases
share a system call. Both ends use this class; what a message means is `owner.py`'s and `helper.py`'s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

MAX_LINE = 1 << 20      # a message is a few hundred bytes; a longer line is a broken peer


class Channel(asyncio.Protocol):
    """One end of the channel: `send` queues a message, `on_message` gets each one received."""

    def __init__(self, on_message: Callable[[list], None], on_lost: Callable[[], None] = lambda: None) -> None:
        self.on_message, self.on_lost = on_message, on_lost
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._partial = b""
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, message: list) -> None:
        if self.closed:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(json.dumps(message, separators=(",", ":")).encode())

    def _flush(self) -> None:
        if self._out and not self.closed:
            self._out.append(b"")
            self.transport.write(b"\n".join(self._out))
        self._out = []

    def data_received(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self.transport.close()
            return
        for line in lines:
            self.on_message(json.loads(line))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_lost()
