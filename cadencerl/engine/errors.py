"""The ways talking to a vLLM server fails: each message is one line and names the URL."""

from __future__ import annotations


class EngineError(Exception):
    """Any failure talking to a vLLM server; the message is one line and names the URL."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(f"{message} [{url}]")
        self.url = url


class EngineConnectionError(EngineError):
    """The server could not be reached, or the connection broke mid-request."""


class EngineUnreachableError(EngineConnectionError):
    """No connection could be opened (httpx's transport writes nothing before it has one): the
    request never reached the server, so sending it again cannot duplicate work."""


class EngineTimeoutError(EngineError):
    """The server did not answer (or become healthy) in time."""


class EngineHTTPError(EngineError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, *, url: str, status_code: int) -> None:
        super().__init__(message, url=url)
        self.status_code = status_code


class EngineProtocolError(EngineError):
    """The server answered something this client does not understand, or reported an error."""


class ModelMismatchError(EngineError):
    """The server does not serve the model the caller expects."""
