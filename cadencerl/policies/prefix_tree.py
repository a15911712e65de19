"""The router's approximate prefix tree, as the cache-aware routers keep it.

One tree is shared by all workers (tenants): each tenant is the set of request prefixes the router
*believes* a worker holds because it routed them there (no engine feedback). A rollout request's
text is a prompt shared by a group, then one trajectory's own history, so the tree has two levels.
Sizes are counted in tokens; a tenant over `max_tree_size` loses its least recently used leaves.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Tenant:
    prompts: OrderedDict = field(default_factory=OrderedDict)   # group -> prompt tokens (LRU order)
    histories: OrderedDict = field(default_factory=OrderedDict)  # trajectory -> prefix tokens routed
    size: int = 0


class PrefixTree:
    def __init__(self, workers: int) -> None:
        self.tenants = [Tenant() for _ in range(workers)]

    def matched(self, worker: int, group: int, traj: int, prompt_len: int, context: int) -> int:
        """Tokens of this request's prefix the router believes `worker` holds."""
        t = self._tenant(worker)
        if group not in t.prompts:
            return 0
        return prompt_len + min(t.histories.get(traj, 0), context - prompt_len)

    def insert(self, worker: int, group: int, traj: int, prompt_len: int, context: int) -> None:
        t = self._tenant(worker)
        if group in t.prompts:
            t.prompts.move_to_end(group)
        else:
            t.prompts[group] = prompt_len
            t.size += prompt_len
        hist = context - prompt_len
        old = t.histories.pop(traj, 0)
        t.size += hist - old
        t.histories[traj] = hist

    def _tenant(self, worker: int) -> Tenant:
        """A live router may add workers after the tree was made: their tenants start empty."""
        while worker >= len(self.tenants):
            self.tenants.append(Tenant())
        return self.tenants[worker]

    def evict(self, max_size: int) -> None:
        """The periodic eviction: LRU leaves of every tenant over `max_size` tokens."""
        for t in self.tenants:
            while t.size > max_size and (t.histories or t.prompts):
                if t.histories:
                    _k, n = t.histories.popitem(last=False)
                else:
                    _k, n = t.prompts.popitem(last=False)
                t.size -= n
