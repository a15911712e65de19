"""Why the router turns a request away now: the hold queue is full (429), no server is up (503),
or the prompt fits no server's KV (400 naming its field)."""

from __future__ import annotations

from cadencerl.router.requests import ApiError


class Rejected(Exception):
    """A request the router will not serve now: 429 (hold queue) or 503 (no server)."""

    def __init__(self, status: int, reason: str, message: str, retry_after: int = 1, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.retry_after, self.param = status, reason, retry_after, param


class TooLong(Exception):
    """A waiting request that no server's KV can hold any more: a server reported a smaller capacity."""

    def __init__(self, tokens: int, largest: int) -> None:
        super().__init__(tokens, largest)
        self.tokens, self.largest = tokens, largest


def too_long(tokens: int, field: str, largest: int) -> ApiError:
    """The 400 for a prompt no server's KV can hold, naming the request's field (`prompt`, `messages`)."""
    return ApiError(400, f"{field}: about {tokens} tokens, more than any server's KV capacity "
                         f"({largest - 1} tokens at most)", field)
