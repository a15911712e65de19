"""The router's approximate prefix tree, as the cache-aware routers keep it.

One tree is shared by all workers (tenants): each tenant is the set of request prefixes the router
*believes* a worker holds because it routed them there (no engine feedback). A rollout request's
text is a prompt shared by a group, then one trajectory's own history, so the tree has two levels.
A live router's prompts also share leading parts across groups (a system prompt, few-shot examples):
such a request carries its prompt's prefix chain (`TrajectorySpec.prefix`, `LINK_TOKENS` a link,
each link's key naming the whole prompt up to its end), and a prompt whose group a worker has not
seen matches the leading links it holds, as vllm-router's radix tree matches a shared head.
Sizes are counted in tokens; a tenant over `max_tree_size` loses its least recently used leaves:
histories first, then prompts, then links (the heads prompts share, as a radix tree's inner nodes go
after the leaves below them).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


LINK_TOKENS = 64        # the tokens a prefix chain's link covers (routing needs no finer grain)


@dataclass
class Tenant:
    prompts: OrderedDict = field(default_factory=OrderedDict)   # group -> prompt tokens (LRU order)
    histories: OrderedDict = field(default_factory=OrderedDict)  # trajectory -> prefix tokens routed
    links: OrderedDict = field(default_factory=OrderedDict)     # prefix-chain link keys routed (LRU order)
    size: int = 0


class PrefixTree:
    def __init__(self, workers: int) -> None:
        self.tenants = [Tenant() for _ in range(workers)]

    def matched(self, worker: int, group: int, traj: int, prompt_len: int, context: int,
                prefix: tuple[int, ...] = ()) -> int:
        """Tokens of this request's prefix the router believes `worker` holds: its whole prompt and
        history if it saw the group, else the leading links of `prefix` it holds."""
        t = self._tenant(worker)
        if group in t.prompts:
            return prompt_len + min(t.histories.get(traj, 0), context - prompt_len)
        if not prefix:
            return 0
        held, links = 0, t.links
        for key in prefix:
            if key not in links:
                break
            held += 1
        return min(prompt_len, held * LINK_TOKENS)

    def insert(self, worker: int, group: int, traj: int, prompt_len: int, context: int,
               prefix: tuple[int, ...] = ()) -> None:
        t = self._tenant(worker)
        if group in t.prompts:
            t.prompts.move_to_end(group)
        else:                       # its tokens past its links' (which count their own)
            tail = t.prompts[group] = max(0, prompt_len - LINK_TOKENS * len(prefix))
            t.size += tail
        hist = context - prompt_len
        old = t.histories.pop(traj, 0)
        t.size += hist - old
        t.histories[traj] = hist
        links = t.links
        for key in prefix:
            if key in links:
                links.move_to_end(key)
            else:
                links[key] = None
                t.size += LINK_TOKENS

    def _tenant(self, worker: int) -> Tenant:
        """A live router may add workers after the tree was made: their tenants start empty."""
        while worker >= len(self.tenants):
            self.tenants.append(Tenant())
        return self.tenants[worker]

    def evict(self, max_size: int) -> None:
        """The periodic eviction: LRU leaves of every tenant over `max_size` tokens."""
        for t in self.tenants:
            while t.size > max_size and (t.histories or t.prompts or t.links):
                if t.histories:
                    _k, n = t.histories.popitem(last=False)
                elif t.prompts:
                    _k, n = t.prompts.popitem(last=False)
                else:
                    t.links.popitem(last=False)
                    n = LINK_TOKENS
                t.size -= n
