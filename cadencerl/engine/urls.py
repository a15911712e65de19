"""What counts as a server's URL: one rule for every face that takes one (`run`, the trainer API,
`calibrate`, the router's `--workers` and its admin endpoint)."""

from __future__ import annotations

from urllib.parse import urlparse


def check_server_url(url: str, where: str) -> str:
    """`url` without its trailing slash; ValueError (naming `where`) unless it is an http(s) URL with
    a host (a bracketed IPv6 address too) and, if given, a port in 1-65535: urlparse alone accepts
    port 99999, which would crash later in the socket layer. A path is kept (a server behind a
    proxy's prefix); query, fragment, credentials and a closing `/v1` (the OpenAI clients' base URL,
    not the server's) are refused, as requests append `/v1/...` and `/health` to the path."""
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme not in ("http", "https") or not parsed.hostname or any(c.isspace() for c in url):
        raise ValueError(f"{where} {url!r} is not an http(s) URL with a host")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{where} {url!r}: the port must be a number in 1-65535")
    if "?" in url or "#" in url or parsed.username is not None:     # an empty query or fragment too
        raise ValueError(f"{where} {url!r}: give the server's URL alone, without a query, fragment or user")
    if parsed.path.rstrip("/").endswith("/v1"):      # requests add /v1/...: every one would 404
        raise ValueError(f"{where} {url!r}: give the server's root URL, without /v1")
    return url.rstrip("/")
