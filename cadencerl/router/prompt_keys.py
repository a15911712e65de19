"""What the router keys a prompt by: its length in tokens (counted for token ids, estimated for
text), its group (the whole prompt hashed: one prompt, one prefix-tree entry) and its prefix chain
(its head hashed a link at a time, which the prefix tree matches across prompts that share it).
"""

from __future__ import annotations

import hashlib
import zlib
from array import array

from cadencerl.policies.prefix_tree import LINK_TOKENS

CHARS_PER_TOKEN = 4          # a text prompt's length in tokens, without a tokenizer (an estimate)
MAX_LINKS = 64               # a prompt's prefix chain covers its first 4,096 tokens (LINK_TOKENS a link)


def prompt_group(prompt: object) -> int:
    """A prompt's prefix-tree group: token ids (a list of ints) hashed as 8-byte integers, anything
    else (an id past 2**63 too) by its repr (the repr of 4,096 ids alone was 300 us of a
    request's parse)."""
    ids = id_bytes(prompt)
    return group_of(ids if ids is not None else repr(prompt).encode())


def id_bytes(prompt: object) -> bytes | None:
    """A token-id prompt as 8-byte integers, which its group and its chain hash (80 us for 4,096 ids,
    so a request's parse makes them once); None for any other prompt, or one with an id past 2**63."""
    if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        try:
            return array("q", prompt).tobytes()
        except OverflowError:
            pass
    return None


def resume_group(prompt_ids: tuple[int, ...], tokens: list[int]) -> int:
    """The group of the request that resumes one handed `tokens`: its prompt is the two together."""
    return prompt_group([*prompt_ids, *tokens])


def prefix_chain(prompt: object, ids: bytes | None = None) -> tuple[int, ...]:
    """The keys of a prompt's whole links of `LINK_TOKENS` (64 token ids, or 64 tokens' estimated
    characters of a text or of a chat's messages, role and text each), the first `MAX_LINKS`: each the
    CRC-32 of the prompt up to the link's end, and its position. Two prompts share the keys of the
    head they share (a system prompt), which the prefix tree matches across their groups. `ids`:
    the prompt's `id_bytes`, when the caller has them."""
    if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        if len(prompt) < LINK_TOKENS:
            return ()
        data = id_bytes(prompt[:MAX_LINKS * LINK_TOKENS]) if ids is None else ids
        if data is None:            # an id past 2**63: no chain (its group is by repr)
            return ()
        step = 8 * LINK_TOKENS
        view = memoryview(data)
        ends = range(step, min(len(data), MAX_LINKS * step) + 1, step)
        links: list[bytes | memoryview] = [view[end - step:end] for end in ends]
    else:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            prompt = "".join(f"{m.get('role')}:{text_of(m.get('content'))}\n" for m in prompt)
        if not isinstance(prompt, str):
            return ()
        step = CHARS_PER_TOKEN * LINK_TOKENS       # in characters, as `prompt_len` counts them
        links = [prompt[end - step:end].encode() for end in range(step, min(len(prompt), MAX_LINKS * step) + 1, step)]
    crc, keys = 0, []
    for i, link in enumerate(links):
        crc = zlib.crc32(link, crc)
        keys.append(crc | i << 32)
    return tuple(keys)


def group_of(data: bytes) -> int:
    """A 63-bit hash of a prompt (or a pass-through body): one prompt, one prefix-tree group."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


def prompt_len(prompt: object) -> int:
    """Tokens of a prompt: counted for token ids, estimated from characters for text."""
    if isinstance(prompt, str):
        return max(1, -(-len(prompt) // CHARS_PER_TOKEN))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return sum(prompt_len(text_of(m.get("content"))) for m in prompt)
    return sum(prompt_len(p) for p in prompt) if isinstance(prompt, list) else 1


def text_of(content: object) -> str:
    """A message's content as text: its text parts joined; one space for none (it still counts a token)."""
    if isinstance(content, str):
        return content or " "
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict)) or " "
    return " "
