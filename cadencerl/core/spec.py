"""What the trainer submits: observable prompt facts plus sealed future lengths.

The target length of each trajectory is sealed in a `HiddenLength`: only the backend (which plays
the engine that decides when EOS happens) and an explicitly named oracle hold the key to read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadencerl.core.sealed import NO_TURNS, HiddenLength, PeekError, SealedTurns, Turn  # noqa: F401 (theirs too)


@dataclass(frozen=True)
class TrajectorySpec:
    """What the trainer submits: observable prompt facts plus sealed future lengths."""

    id: int
    group: int
    prompt_len: int
    response: HiddenLength  # first (or only) reply
    workload_class: str = "rlvr"
    later_turns: SealedTurns = field(default=NO_TURNS)
    route_key: str | None = None  # a live request's routing key (session id, user, whole prompt); None in the simulator
    max_new_tokens: int | None = None   # the router's requests: the first one's bound on its reply (vLLM may
                                        # stop earlier at EOS). None elsewhere: the simulator draws lengths, and
                                        # the trainer API's runs decode exactly max_tokens (it is the length)
    prefix: tuple[int, ...] = ()        # the router's requests: the prompt's prefix chain (policies/prefix_tree.py),
                                        # what it shares with other groups' prompts; none in the simulator


def total_tokens(spec: TrajectorySpec, key: object) -> int:
    """The KV a trajectory ends with: prompt, every reply and every observation (opens the seal)."""
    return spec.prompt_len + spec.response.reveal(key) + sum(t.observation_len + t.response.reveal(key)
                                                             for t in spec.later_turns.reveal(key))
