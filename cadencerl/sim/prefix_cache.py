"""A per-engine prefix cache in the manner of vLLM's automatic prefix caching.

Blocks of a request are shared while it runs; when it leaves (finishes, is aborted or preempted)
they stay cached but evictable, least recently used first, as the running set needs room. Two
kinds of prefix exist in a rollout: a prompt shared by the samples of one group, and one
trajectory's own history (what a later turn of the same session, or a resume, can reuse).
Hits are counted as vLLM counts them: tokens hit over tokens queried. New weights empty the cache
(`drop_cached`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

BLOCK = 16  # tokens per KV block unless the accelerator says otherwise (vLLM's default on GPUs)


@dataclass
class PrefixCache:
    lru: OrderedDict = field(default_factory=OrderedDict)   # unreferenced prefix -> cached tokens
    in_use: dict = field(default_factory=dict)               # shared prompt prefix -> running users
    cached_tokens: int = 0
    queried: int = 0
    hits: int = 0
    block: int = BLOCK

    def claim(self, group: int, traj: int, prompt_len: int, context: int) -> int:
        """A request starts running: reuse what is cached, return the hit tokens (block multiples)."""
        pk, tk = _keys(group, traj)
        hit = 0
        if pk in self.in_use or pk in self.lru:
            hit = prompt_len
            own = self.lru.get(tk, 0)
            hit += min(own, context - prompt_len)
        hit = min(hit, context - 1) // self.block * self.block  # at least one token is always computed
        if tk in self.lru:
            self.cached_tokens -= self.lru.pop(tk)
        if pk in self.lru:
            self.cached_tokens -= self.lru.pop(pk)
        self.in_use[pk] = self.in_use.get(pk, 0) + 1
        self.queried += context
        self.hits += hit
        return hit

    def release(self, group: int, traj: int, prompt_len: int, context: int) -> None:
        """A request stops running: its blocks become cached and evictable."""
        pk, tk = _keys(group, traj)
        users = self.in_use.get(pk, 0) - 1
        if users > 0:
            self.in_use[pk] = users
        else:
            self.in_use.pop(pk, None)
            self._put(pk, prompt_len)
        if context > prompt_len:
            self._put(tk, context - prompt_len)

    def trim(self, free_tokens: int) -> None:
        """Evict least recently used prefixes until the cache fits in the free KV."""
        while self.cached_tokens > max(0, free_tokens) and self.lru:
            _key, n = self.lru.popitem(last=False)
            self.cached_tokens -= n

    def drop_cached(self) -> None:
        """New weights make every cached prefix stale: the RL frameworks reset the prefix cache with
        each weight update (the real pool pauses with `clear_cache=true`). A worker takes new weights
        only empty or after an interrupt evicted its requests, so nothing is running (`in_use`
        holds only running requests' prompts, released as they leave)."""
        self.lru.clear()
        self.cached_tokens = 0

    def _put(self, key, tokens: int) -> None:
        if key in self.lru:
            self.cached_tokens -= self.lru.pop(key)
        self.lru[key] = tokens
        self.cached_tokens += tokens


def _keys(group: int, traj: int) -> tuple[int, int]:
    """The cache keys of a group's shared prompt and of one trajectory's own history: distinct ints
    (even and odd), which hash faster than the ("p", group) and ("t", traj) pairs they stand for."""
    return 2 * group, 2 * traj + 1
