"""What the router reads from a request: who sent it (session, class), how long its prompt is, and
whether it is well formed. Bad input is an `ApiError` with an OpenAI-style body, never a crash.

The prompt is a completion's `prompt`, a chat's `messages`, or a response's `instructions` and
`input` (earlier turns of a `previous_response_id` are sized where the turn is placed, `service.py`).
Headers: `X-Session-Id`, `X-Workload-Class`, `X-Session-End`; `X-User-Id`, `X-Tenant-Id`,
`X-Correlation-Id` and the body fields vllm-router reads are affinity keys only, not sessions.
What each means and why: the README and docs/internals.md, "router".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import zlib
from array import array
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from cadencerl.policies.prefix_tree import LINK_TOKENS

SESSION_HEADER = "x-session-id"
CLASS_HEADER = "x-workload-class"
END_HEADER = "x-session-end"
RESUMABLE_HEADER = "x-cadencerl-resumable"   # `0`: never evict this request, though its shape resumes
AFFINITY_HEADERS = ("x-user-id", "x-tenant-id", "x-correlation-id")     # vllm-router's order
BODY_AFFINITY_FIELDS = ("user", "session_id", "user_id")                 # after session_params.session_id
CHARS_PER_TOKEN = 4          # a text prompt's length in tokens, without a tokenizer (an estimate)
MAX_LINKS = 64               # a prompt's prefix chain covers its first 4,096 tokens (LINK_TOKENS a link)


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
    group = _group(raw)
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
    group = prompt_group(prompt)
    route_key = route_key_of(headers, body, key, group)
    previous = body.get("previous_response_id") if field == "input" else None
    return Routed(raw, bool(body.get("stream", False)), key, route_key, cls, last, _length(prompt), group,
                  previous, field == "input" and body.get("store", True) is True, field == "input",
                  field == "input" and body.get("background") is True, _max_new_tokens(body, field, prompt),
                  tuple(prompt) if _resumes(body, field, prompt, headers) else None, prefix_chain(prompt))


def prefix_chain(prompt: object) -> tuple[int, ...]:
    """The keys of a prompt's whole links of `LINK_TOKENS` (64 token ids, or 64 tokens' estimated
    characters of a text or of a chat's messages, role and text each), the first `MAX_LINKS`: each the
    CRC-32 of the prompt up to the link's end, and its position. Two prompts share the keys of the
    head they share (a system prompt), which the prefix tree matches across their groups."""
    if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        if len(prompt) < LINK_TOKENS:
            return ()
        try:
            data = array("q", prompt[:MAX_LINKS * LINK_TOKENS]).tobytes()
        except OverflowError:       # an id past 2**63: no chain (its group is by repr)
            return ()
        step = 8 * LINK_TOKENS
        links = [data[end - step:end] for end in range(step, len(data) + 1, step)]
    else:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            prompt = "".join(f"{m.get('role')}:{_text(m.get('content'))}\n" for m in prompt)
        if not isinstance(prompt, str):
            return ()
        step = CHARS_PER_TOKEN * LINK_TOKENS       # in characters, as `_length` counts them
        links = [prompt[end - step:end].encode() for end in range(step, min(len(prompt), MAX_LINKS * step) + 1, step)]
    crc, keys = 0, []
    for i, link in enumerate(links):
        crc = zlib.crc32(link, crc)
        keys.append(crc | i << 32)
    return tuple(keys)


def _resumes(body: dict, field: str, prompt: object, headers) -> bool:
    """Whether the client resumes the request when handed `finish_reason: "abort"` and the tokens so
    far (AReaL's shape: one completion of a token-id prompt, answered whole, with the generated token
    ids, `return_tokens_as_token_ids` and `logprobs`), so that the router may evict it."""
    return (field == "prompt" and not body.get("stream") and body.get("n", 1) == 1
            and isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
            and body.get("return_tokens_as_token_ids") is True and body.get("logprobs") is not None
            and headers.get(RESUMABLE_HEADER, "1").lower() not in ("0", "false", "no"))


def resume_group(prompt_ids: tuple[int, ...], tokens: list[int]) -> int:
    """The group of the request that resumes one handed `tokens`: its prompt is the two together."""
    return prompt_group([*prompt_ids, *tokens])


def prompt_group(prompt: object) -> int:
    """A prompt's prefix-tree group: token ids (checked by `is_token_ids`) hashed as 8-byte integers,
    anything else by its repr (the repr of 4,096 ids alone was 300 us of a request's parse)."""
    if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        with contextlib.suppress(OverflowError):        # an id past 2**63: by its repr, as the rest
            return _group(array("q", prompt).tobytes())
    return _group(repr(prompt).encode())


def _json_object(raw: bytes) -> dict:
    """The body as a JSON object whose common fields are well typed, else a 400 saying what is wrong."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body is not valid JSON") from None
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    _check_fields(body)
    return body


def _group(data: bytes) -> int:
    """A 63-bit hash of a prompt (or a pass-through body): one prompt, one prefix-tree group."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


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
            texts.append(_text(item["content"]))
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


def _length(prompt: object) -> int:
    """Tokens of a prompt: counted for token ids, estimated from characters for text."""
    if isinstance(prompt, str):
        return max(1, -(-len(prompt) // CHARS_PER_TOKEN))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return sum(_length(_text(m.get("content"))) for m in prompt)
    return sum(_length(p) for p in prompt) if isinstance(prompt, list) else 1


def _text(content: object) -> str:
    if isinstance(content, str):
        return content or " "
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict)) or " "
    return " "
