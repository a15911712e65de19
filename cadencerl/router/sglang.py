"""SGLang's native `/generate` in the router's terms: its body as a vLLM token-id completion, and
vLLM's answer (whole or streamed) back in SGLang's shape (`text`, `output_ids`, `meta_info` with
`finish_reason` `length` / `stop` / `abort`). Pure functions, so that `/generate` goes through the
router's own admission, session and retry path as a completion and every policy applies to it.
Fields and their sources: docs/sglang-verl.md.
"""

from __future__ import annotations

import json

from cadencerl.router.requests import ApiError, is_token_ids

ROUTING_KEY_HEADER = "x-smg-routing-key"     # SGLang Model Gateway's routing key: the session here
MAX_NEW_TOKENS = 128                         # SGLang's default `max_new_tokens`
_TOKEN_ID = "token_id:"
# sampling_params -> the completion's field of the same meaning (vLLM's SamplingParams names)
_SAME = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
         "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "n")
_RENAMED = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed",
            "no_stop_trim": "include_stop_str_in_output"}
_IGNORED = ("custom_params",)                # SGLang-only extras (a custom logit processor's arguments)
_REFUSED = ("regex", "json_schema", "ebnf", "structural_tag")


def completion_body(body: object) -> dict:
    """The `/v1/completions` body of one SGLang `/generate` body; a 400 naming the field it cannot take."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise ApiError(400, "sampling_params: must be an object", "sampling_params")
    out: dict = {"prompt": _prompt(body), "max_tokens": MAX_NEW_TOKENS}
    for name, value in params.items():
        if value is None or name in _IGNORED:
            continue
        if name in _REFUSED:
            raise ApiError(400, f"sampling_params.{name}: constrained decoding is not translated to vLLM behind "
                                "this router", f"sampling_params.{name}")
        if name in _SAME:
            out[name] = value
        elif name in _RENAMED:
            out[_RENAMED[name]] = value
        else:
            raise ApiError(400, f"sampling_params.{name}: not a sampling parameter this router translates",
                           f"sampling_params.{name}")
    top = body.get("top_logprobs_num") or 0
    if not isinstance(top, int) or isinstance(top, bool) or top < 0:
        raise ApiError(400, "top_logprobs_num: must be a non-negative integer", "top_logprobs_num")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream: must be true or false", "stream")
    # the generated token ids ride in the logprobs (`token_id:N`), as AReaL asks: a resumable shape
    out.update(logprobs=top, return_tokens_as_token_ids=True, stream=stream)
    if stream:
        out["stream_options"] = {"include_usage": True}
    return out


def _prompt(body: dict) -> list[int] | str:
    ids, text = body.get("input_ids"), body.get("text")
    if ids is not None:
        if is_token_ids(ids):
            return ids
        raise ApiError(400, "input_ids: must be one non-empty list of token ids (one prompt per request)", "input_ids")
    if isinstance(text, str) and text:
        return text
    raise ApiError(400, "input_ids or text: required (token ids, or a non-empty string)", "input_ids")


def finish_reason(reason: str | None, stop_reason: object, ids: list[int], message: str = "") -> dict | None:
    """SGLang's `meta_info.finish_reason` for vLLM's `finish_reason` / `stop_reason`."""
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": len(ids)}
    if reason == "abort":
        return {"type": "abort", "message": message or "aborted by the router (evicted or abort_request)",
                "status_code": None, "err_type": None}       # FINISH_ABORT.to_json's keys
    matched = stop_reason if stop_reason is not None else (ids[-1] if ids else None)   # EOS: its token id
    return {"type": "stop", "matched": matched}


def token_ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix(_TOKEN_ID)) for t in tokens]


def _logprob_items(logprobs: list, ids: list[int]) -> list[list]:
    return [[lp, t, None] for lp, t in zip(logprobs, ids)]


def _top_items(top: list | None) -> list:
    return [[[lp, int(k.removeprefix(_TOKEN_ID)), None] for k, lp in (entry or {}).items()] for entry in top or ()]


def answer(completion: dict, return_logprob: bool, rid: str | None = None, top_logprobs: bool = False,
           prompt_tokens: int = 0) -> dict:
    """SGLang's `/generate` answer for vLLM's whole completion answer (one choice); `prompt_tokens`:
    the prompt's length when the answer has no usage (one handed back before its end)."""
    choice = (completion.get("choices") or [{}])[0]
    logprobs = choice.get("logprobs") or {}
    ids = token_ids(logprobs.get("tokens") or [])
    usage = completion.get("usage") or {}
    meta = {"id": rid or completion.get("id", ""),
            "finish_reason": finish_reason(choice.get("finish_reason"), choice.get("stop_reason"), ids),
            "prompt_tokens": usage.get("prompt_tokens") or prompt_tokens, "completion_tokens": len(ids), "cached_tokens": 0}
    if return_logprob:
        meta["output_token_logprobs"] = _logprob_items(logprobs.get("token_logprobs") or [], ids)
        if top_logprobs:
            meta["output_top_logprobs"] = _top_items(logprobs.get("top_logprobs"))
    return {"text": choice.get("text") or "", "output_ids": ids, "meta_info": meta}


class StreamAnswer:
    """vLLM's completion stream as SGLang streams `/generate`: each event carries the text and
    `output_ids` so far (SGLang's default, not incremental) and the `meta_info` so far."""

    def __init__(self, return_logprob: bool, rid: str | None = None) -> None:
        self.return_logprob, self.rid = return_logprob, rid
        self.text, self.ids, self.logprobs = "", [], []
        self.prompt_tokens = 0
        self.reason: dict | None = None

    def feed(self, event: dict) -> list[bytes]:
        """One vLLM event; the SGLang events it makes (an error event passes as it is)."""
        if "error" in event:
            return [_data(event)]
        if usage := event.get("usage"):
            self.prompt_tokens = usage.get("prompt_tokens") or self.prompt_tokens
        out = []
        for choice in event.get("choices") or ():
            logprobs = choice.get("logprobs") or {}
            new = token_ids(logprobs.get("tokens") or [])
            self.ids += new
            self.logprobs += _logprob_items(logprobs.get("token_logprobs") or [], new)
            self.text += choice.get("text") or ""
            self.reason = finish_reason(choice.get("finish_reason"), choice.get("stop_reason"), self.ids)
            out.append(_data(self.current()))
        return out

    def current(self) -> dict:
        meta = {"id": self.rid or "", "finish_reason": self.reason, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": len(self.ids), "cached_tokens": 0}
        if self.return_logprob:
            meta["output_token_logprobs"] = list(self.logprobs)
        return {"text": self.text, "output_ids": list(self.ids), "meta_info": meta}


def _data(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def translate_events(chunk: bytes, stream: StreamAnswer) -> bytes:
    """Whole SSE events of vLLM's stream (`framing.py` hands them whole) in SGLang's shape."""
    out = []
    for event in chunk.split(b"\n\n"):
        data = event.strip()
        if not data.startswith(b"data:"):
            continue
        payload = data[5:].strip()
        if payload == b"[DONE]":
            if stream.prompt_tokens and stream.reason is not None:   # the usage came after the last token
                out.append(_data(stream.current()))
            out.append(b"data: [DONE]\n\n")
            continue
        try:
            out += stream.feed(json.loads(payload))
        except ValueError:
            continue
    return b"".join(out)
