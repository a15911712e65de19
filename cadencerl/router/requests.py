"""What the router reads from a request: who sent it (session, class), how long its prompt is, and
whether it is well formed. Bad input is an `ApiError` with an OpenAI-style body, never a crash.

The prompt is a completion's `prompt`, a chat's `messages`, or a response's `instructions` and
`input` (earlier turns of a `previous_response_id` are sized where the turn is placed, `service.py`).
Headers: `X-Session-Id`, `X-Workload-Class`, `X-Session-End`; `X-User-Id`, `X-Tenant-Id`,
`X-Correlation-Id` and the body fields vllm-router reads are affinity keys only, not sessions.
What each means and why: the README and docs/internals.md, "router".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from cadencerl.router.prompt_keys import (CHARS_PER_TOKEN, group_of, id_bytes, prefix_chain, prompt_group, prompt_len,
                                          text_of)

SESSION_HEADER = "x-session-id"
CLASS_HEADER = "x-workload-class"
END_HEADER = "x-session-end"
RESUMABLE_HEADER = "x-cadencerl-resumable"   # `0`: never evict this request, though its shape resumes
AFFINITY_HEADERS = ("x-user-id", "x-tenant-id", "x-correlation-id")     # vllm-router's order
BODY_AFFINITY_FIELDS = ("user", "session_id", "user_id")                 # after session_params.session_id


class RawHeaders(Headers):
    """Starlette's `Headers` over a connection's raw (lower-case) header list, each name looked up
    in a dict made once: Starlette scans the list on every lookup and raises a KeyError for every
    absent header, and a request asks for about ten of them (most absent)."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        super().__init__(raw=raw)
        self._first = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(raw)}

    def __getitem__(self, key: str) -> str:
        return self._first[key.lower()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._first

    def get(self, key: str, default=None):
        return self._first.get(key.lower(), default)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.kind, self.headers)


def error_response(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def internal_error(exc: Exception) -> JSONResponse:
    """The 500 of an unhandled exception: its kind only (the traceback goes to the log)."""
    return error_response(500, f"internal router error: {type(exc).__name__}", kind="internal_error")


@dataclass(slots=True)
class Routed:
    """One completion request as the router sees it (read, never changed: not frozen only because a
    frozen dataclass's construction cost 1.8 us of the Rust data path's 100 a request)."""

    raw: bytes
    stream: bool
    session_key: str | None     # X-Session-Id: a multi-turn session that parks between turns
    route_key: str              # what `consistent-hash` hashes (`route_key_of`)
    workload_class: str
    last: bool
    prompt_len: int
    group: int
    previous_response_id: str | None = None   # /v1/responses: the stored response it continues
    remember: bool = False                    # /v1/responses, `store` left out or true (vLLM stores no other): learn its answer's id
    responses: bool = False                   # /v1/responses: a stream's tokens are its usage, not its events
    background: bool = False                  # /v1/responses, `background: true`: answered before it is generated
    max_new_tokens: int | None = None         # max_tokens (max_completion_tokens, max_output_tokens), if given
    prompt_ids: tuple[int, ...] | None = None  # a resumable request's prompt: its client re-sends it with the
                                               # tokens it was handed when evicted (`resumable.py`)
    prefix: tuple[int, ...] = ()              # the prompt's prefix chain (`prefix_chain`)


@dataclass(frozen=True)
class PassThrough:
    """A request the router only places and relays (`passthrough.py`), forwarded as received."""

    raw: bytes
    route_key: str              # `route_key_of`, as a completion's
    group: int                  # the body, hashed: one input is one prefix-tree entry
    prompt_len: int             # estimated from the body's size, for the prefix tree's bookkeeping only


async def read_pass_through(request: Request, max_bytes: int) -> PassThrough:
    """The body must be a JSON object with the common fields well typed; the rest is the server's to check."""
    raw = await _read_body(request, max_bytes)
    body = _json_object(raw)
    group = group_of(raw)
    route_key = route_key_of(request.headers, body, request.headers.get(SESSION_HEADER), group)
    return PassThrough(raw, route_key, group, max(1, len(raw) // CHARS_PER_TOKEN))


async def read_request(request: Request, field: str, classes: dict[str, float], default_class: str,
                       max_bytes: int) -> Routed:
    """A generating request; `field` names its prompt: `prompt`, `messages` (chat) or `input` (responses)."""
    return parse_request(await _read_body(request, max_bytes), request.headers, field, classes, default_class)


def parse_request(raw: bytes, headers, field: str, classes: dict[str, float], default_class: str) -> Routed:
    """`read_request` on a body already read (the data path's, `datapath.py`)."""
    try:
        return _route(raw, headers, field, classes, default_class)
    except RecursionError:     # hashing a prompt nested about a thousand levels deep
        raise ApiError(400, "the body is nested too deeply") from None


def check_content_type(headers) -> None:
    """A text/* body on a generating route is a 415 (vllm-router's answer; vLLM reads no such body either)."""
    ctype = headers.get("content-type", "application/json").partition(";")[0].strip().lower()
    if ctype.startswith("text/"):
        raise ApiError(415, f"content-type: {ctype} is not JSON (send application/json)", "content-type",
                       "unsupported_media_type")


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"the body is over {max_bytes} bytes", kind="request_too_large")


def _route(raw: bytes, headers, field: str, classes: dict[str, float], default_class: str) -> Routed:
    body = _json_object(raw)
    prompt = _PROMPTS[field](body)
    cls = headers.get(CLASS_HEADER) or default_class
    if cls not in classes:
        raise ApiError(400, f"{CLASS_HEADER}: unknown class {cls!r} (known: {', '.join(classes)})", CLASS_HEADER)
    key = headers.get(SESSION_HEADER) or None
    last = headers.get(END_HEADER, "").lower() in ("1", "true", "yes")
    ids = id_bytes(prompt)      # one conversion of a token-id prompt, for its group and its chain
    group = group_of(ids) if ids is not None else prompt_group(prompt)
    route_key = route_key_of(headers, body, key, group)
    previous = body.get("previous_response_id") if field == "input" else None
    return Routed(raw, bool(body.get("stream", False)), key, route_key, cls, last, prompt_len(prompt), group,
                  previous, field == "input" and body.get("store", True) is True, field == "input",
                  field == "input" and body.get("background") is True, _max_new_tokens(body, field, prompt),
                  tuple(cast(list, prompt)) if _resumes(body, field, prompt, headers) else None, prefix_chain(prompt, ids))


def _resumes(body: dict, field: str, prompt: object, headers) -> bool:
    """Whether the client resumes the request when handed `finish_reason: "abort"` and the tokens so
    far (AReaL's shape: one completion of a token-id prompt, answered whole, with the generated token
    ids, `return_tokens_as_token_ids` and `logprobs`), so that the router may evict it."""
    return (field == "prompt" and not body.get("stream") and body.get("n", 1) == 1
            and isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
            and body.get("return_tokens_as_token_ids") is True and body.get("logprobs") is not None
            and headers.get(RESUMABLE_HEADER, "1").lower() not in ("0", "false", "no"))


def _json_object(raw: bytes) -> dict:
    """The body as a JSON object whose common fields are well typed, else a 400 saying what is wrong."""
    try:
        body = read_json(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body is not valid JSON") from None
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    _check_fields(body)
    return body


def read_json(raw: bytes) -> object:
    """msgspec (a 4,096-id body in 120 us, against the standard library's 280; orjson, as fast, reads
    an integer past 64 bits as a float), and the standard library's reading of what msgspec refuses
    (NaN, 1e400, a lone surrogate, a body in UTF-16): every body reads as before, only faster."""
    try:
        return _DECODE(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


_DECODE = msgspec.json.Decoder().decode


def route_key_of(headers, body: dict, session_key: str | None, group: int) -> str:
    """What consistent-hash hashes, in vllm-router's order: the session id, the other session headers,
    then the body's `session_params.session_id`, `user`, `session_id`, `user_id`; keyless, the whole
    prompt (as vllm-router hashes a keyless body): the samples of one prompt share a server, while
    prompts that only share a long system prompt still spread. None but X-Session-Id opens a session."""
    if session_key:
        return f"session:{session_key}"
    for name in AFFINITY_HEADERS:
        if value := headers.get(name):
            return f"{name}:{value}"
    params = body.get("session_params")
    fields = (("session_params.session_id", params.get("session_id") if isinstance(params, dict) else None),
              *((name, body.get(name)) for name in BODY_AFFINITY_FIELDS))
    for name, value in fields:
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return f"{name}:{value}"
    return f"prompt:{group}"


async def _read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
        raise too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _check_fields(body: dict) -> None:
    """The common fields as vLLM's request models take them: null is the field left out, and a
    count may be written as an integral float (100.0, 1e2)."""
    # 0 new tokens is a completion's `echo` scoring (vLLM takes it); a response with none vLLM refuses
    for name, least in (("max_tokens", 0), ("max_completion_tokens", 0), ("max_output_tokens", 1)):
        value = body.get(name)
        if value is not None and not (_integral(value) and value >= least):
            raise ApiError(400, f"{name}: must be a {'positive' if least else 'non-negative'} integer", name)
    n = body.get("n")
    if n is not None and not (_integral(n) and n >= 1):
        raise ApiError(400, "n: must be a positive integer", "n")
    for name in ("stream", "store", "background"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise ApiError(400, f"{name}: must be true, false or null", name)
    for name in ("model", "user", "instructions", "previous_response_id"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise ApiError(400, f"{name}: must be a string or null", name)


BOUND_FIELDS = {"prompt": ("max_tokens",), "messages": ("max_completion_tokens", "max_tokens"),
                "input": ("max_output_tokens",)}     # per endpoint, as vLLM reads them (chat: the newer first)


def _max_new_tokens(body: dict, field: str, prompt: object) -> int | None:
    """The most tokens the request may generate in all (checked by `_check_fields`), if it names a
    bound: its endpoint's field, times `n` choices, times the prompts of a batched completion."""
    bound = next((body[name] for name in BOUND_FIELDS[field] if body.get(name) is not None), None)
    if bound is None:
        return None
    prompts = len(prompt) if field == "prompt" and isinstance(prompt, list) and not isinstance(prompt[0], int) else 1
    return int(bound) * int(body.get("n") or 1) * prompts


def _integral(value: object) -> bool:
    """An integer, or a float with no fraction (JSON has one number type; vLLM's models take both)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def is_token_ids(value: object) -> bool:
    """A non-empty list of non-negative integer token ids (a JSON true or false is not one). Checked
    at C speed: a rollout's prompt is thousands of ids, and a test an id in a generator was most of
    a 4,096-id request's parse (0.75 of 1.25 ms)."""
    return isinstance(value, list) and bool(value) and set(map(type, value)) == _INT and min(value) >= 0


_INT = {int}


def _prompt(body: dict) -> object:
    """`prompt` as vLLM accepts it: text, a list of texts, token ids, or a list of token-id lists."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt:
        if is_token_ids(prompt):
            return prompt
        if all(isinstance(p, str) for p in prompt):
            return prompt
        if all(is_token_ids(p) for p in prompt):
            return prompt
    raise ApiError(400, "prompt: required, a non-empty string, list of strings, or list(s) of token ids", "prompt")


def _messages(body: dict) -> object:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: required, a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}]: must be an object with a string role", f"messages[{i}]")
        _content(m.get("content"), f"messages[{i}].content")
    return messages


def _input(body: dict) -> list[str]:
    """A Responses request's prompt text, for its length and prefix group: `instructions`, then
    `input`, a string or a list of items whose text counts (a message's content, a tool call's
    arguments, a tool's output). A continuation's earlier turns are on the server, not here: the
    router adds the context it remembers for them when it places the turn (`RouterService.acquire`)."""
    given = body.get("input")
    texts = [body["instructions"]] if body.get("instructions") else []
    if isinstance(given, str) and given:
        return [*texts, given]
    if not isinstance(given, list) or not given:
        raise ApiError(400, "input: required, a non-empty string or list of input items", "input")
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            raise ApiError(400, f"input[{i}]: must be an object", f"input[{i}]")
        if "content" in item:
            _content(item["content"], f"input[{i}].content")
            texts.append(text_of(item["content"]))
        texts.extend(item[k] for k in ("arguments", "output") if isinstance(item.get(k), str))
    return texts


def _content(content: object, where: str) -> None:
    """A message's content as the OpenAI API takes it: text, null, or a list of parts whose text is text."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: must be a string, a list of content parts, or null", where)
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise ApiError(400, f"{where}[{j}]: must be an object", f"{where}[{j}]")
        if (part.get("type") == "text" or "text" in part) and not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}[{j}].text: must be a string", f"{where}[{j}].text")


_PROMPTS = {"prompt": _prompt, "messages": _messages, "input": _input}
