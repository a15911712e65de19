"""A front door's limits on a request: its head's size and header count, the time it may take to arrive.

uvicorn's httptools protocol reads a request head of any size (one of 256 MB was read whole, and
the memory stayed taken) and waits on a head or a body sent a byte at a time for as long as the
client likes. This subclass counts the head's bytes as they arrive and refuses it with a 431 past
`MAX_HEAD_BYTES` or `MAX_HEADERS` headers; answers 408 and closes a connection whose head is not
complete `read_timeout_s()` after its first byte, or whose body sends nothing for that long (nginx's
client_header_timeout and client_body_timeout); and closes one that sent nothing for `keep_alive_s()`
with no request open (uvicorn's keep-alive timeout, here from the connection's start too). A body's
size keeps its own bound (`max_body_bytes`, 413 in `requests.py`).
"""

from __future__ import annotations

import math
import os

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cadencerl.config import ConfigError

MAX_HEAD_BYTES = 64 * 1024      # nginx's default allows 4 x 8 KiB header lines; this is twice that
MAX_HEADERS = 100
READ_TIMEOUT_S = 30.0
KEEP_ALIVE_ENV = "CADENCERL_KEEP_ALIVE_S"
READ_TIMEOUT_ENV = "CADENCERL_READ_TIMEOUT_S"


def keep_alive_s() -> float:
    """How long a connection with no request open may send nothing before it is closed (uvicorn's
    `timeout_keep_alive` on the Python data path, native/datapath/src/idle.rs on the Rust one):
    `CADENCERL_KEEP_ALIVE_S`, 30 unless set; else a ConfigError naming it."""
    return _seconds(KEEP_ALIVE_ENV, 30.0)


def read_timeout_s() -> float:
    """How long a request's head may take from its first byte, and its body between two reads, on
    either data path: `CADENCERL_READ_TIMEOUT_S`, `READ_TIMEOUT_S` unless set; else a ConfigError."""
    return _seconds(READ_TIMEOUT_ENV, READ_TIMEOUT_S)


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ConfigError(f"{name}: expected a positive, finite number of seconds, got {text!r}")
    return value


class RouterConfig(uvicorn.Config):
    """uvicorn's settings and the read timeout its protocol applies (read once, at start)."""

    def __init__(self, app, read_timeout: float, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self.read_timeout_s = read_timeout


def _refusal(status: bytes, message: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(message) + message)


TOO_LARGE = _refusal(b"431 Request Header Fields Too Large",
                     b'{"error":{"message":"the request head is over %d bytes or %d headers","type":'
                     b'"request_header_fields_too_large","param":null,"code":431}}' % (MAX_HEAD_BYTES, MAX_HEADERS))


def too_slow(what: str, seconds: float) -> bytes:
    return _refusal(b"408 Request Timeout", b'{"error":{"message":"the request %s within %g s","type":'
                    b'"request_timeout","param":null,"code":408}}' % (what.encode(), seconds))


class _Refused(Exception):
    """Raised in a parser callback after the refusal went out, so that parsing stops."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol with the limits above on every request (keep-alive ones too)."""

    _head_bytes = 0
    _in_head = False
    _head_timer = None
    _body_timer = None      # armed while a body is arriving over more than one read
    _last_read = 0.0        # the loop's time of the last bytes read while it is armed

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        self.read_timeout = getattr(config, "read_timeout_s", READ_TIMEOUT_S)    # a plain uvicorn.Config: the default

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # uvicorn arms its keep-alive timeout after a reply only: a connection that never sent a
        # request was held for good. Armed from the start, cancelled by the first byte as after a reply.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        if self._in_head:           # counted from the chunk after the one that began the head
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(TOO_LARGE)
                return
        if self._body_timer is not None:
            self._last_read = self.loop.time()
        super().data_received(data)
        if self._body_timer is None and self._reading_body():
            self._last_read = self.loop.time()
            self._body_timer = self.loop.call_later(self.read_timeout, self._body_gap)

    def _reading_body(self) -> bool:
        """Is a request's body still arriving? (uvicorn's cycle, for the app's routes; after a reply
        that did not read it too: uvicorn then arms no keep-alive timer while the rest arrives)"""
        cycle = self.cycle
        return cycle is not None and cycle.more_body

    def _body_gap(self) -> None:
        """The body's timer: 408 if the client sent nothing for the bound (not while reading is
        paused for the app to catch up: the wait is then the router's), else again from its last read."""
        self._body_timer = None
        if not self._reading_body() or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:
            self._last_read = now       # the wait is the router's (its app reads behind): counted afresh
        if now - self._last_read < self.read_timeout:
            self._body_timer = self.loop.call_later(self._last_read + self.read_timeout - now, self._body_gap)
            return
        cycle = self.cycle      # a 408 only where no reply has begun (nor waits behind this one)
        if not (getattr(cycle, "response_started", False) or cycle.response_complete or self.pipeline):
            self.transport.write(too_slow("body sent nothing", self.read_timeout))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if not self.transport.is_closing():     # not after a refusal of ours (it stopped the parser)
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:
            self._start_head()

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            self._refuse(TOO_LARGE)
            raise _Refused      # stops the parser: nothing after this header is read
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().connection_lost(exc)

    def _start_head(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._head_timer = self.loop.call_later(self.read_timeout, self._head_too_slow)

    def _head_too_slow(self) -> None:
        self._refuse(too_slow("head did not arrive", self.read_timeout))

    def _end_head(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, answer: bytes) -> None:
        self._end_head()
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()
