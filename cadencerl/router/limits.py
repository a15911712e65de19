"""A front door's limits on a request's head: its size, its header count, the time it may take.

uvicorn's httptools protocol reads a request head of any size (one of 256 MB was read whole, and
the memory stayed taken) and waits on a head sent a byte at a time for as long as the client likes.
This subclass counts the head's bytes as they arrive and refuses it with a 431 past `MAX_HEAD_BYTES`
or `MAX_HEADERS` headers, and closes a connection whose head is not complete `HEAD_TIMEOUT_S` after
its first byte (408), or that sent nothing for `keep_alive_s()` with no request open (uvicorn's
keep-alive timeout, here from the connection's start too). Bodies keep their own bound
(`max_body_bytes`, 413 in `requests.py`).
"""

from __future__ import annotations

import math
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cadencerl.config import ConfigError

MAX_HEAD_BYTES = 64 * 1024      # nginx's default allows 4 x 8 KiB header lines; this is twice that
MAX_HEADERS = 100
HEAD_TIMEOUT_S = 30.0
KEEP_ALIVE_ENV = "CADENCERL_KEEP_ALIVE_S"


def keep_alive_s() -> float:
    """How long a connection with no request open may send nothing before it is closed (uvicorn's
    `timeout_keep_alive` on the Python data path, native/datapath/src/idle.rs on the Rust one):
    `CADENCERL_KEEP_ALIVE_S`, 30 unless set; else a ConfigError naming it."""
    text = os.environ.get(KEEP_ALIVE_ENV, "30")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ConfigError(f"{KEEP_ALIVE_ENV}: expected a positive, finite number of seconds, got {text!r}")
    return value


def _refusal(status: bytes, message: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(message) + message)


TOO_LARGE = _refusal(b"431 Request Header Fields Too Large",
                     b'{"error":{"message":"the request head is over %d bytes or %d headers","type":'
                     b'"request_header_fields_too_large","param":null,"code":431}}' % (MAX_HEAD_BYTES, MAX_HEADERS))
TOO_SLOW = _refusal(b"408 Request Timeout",
                    b'{"error":{"message":"the request head did not arrive within %d s","type":"request_timeout",'
                    b'"param":null,"code":408}}' % HEAD_TIMEOUT_S)


class _Refused(Exception):
    """Raised in a parser callback after the refusal went out, so that parsing stops."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol with the limits above on every request head (keep-alive ones too)."""

    _head_bytes = 0
    _in_head = False
    _head_timer = None

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
        super().data_received(data)

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
        super().connection_lost(exc)

    def _start_head(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._refuse, TOO_SLOW)

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
