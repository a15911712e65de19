"""A trajectory's future, sealed: its reply lengths and later turns, readable only with a key.

Only the backend (which plays the engine that decides when EOS happens, and the environment) and
an explicitly named oracle hold the key; any other read raises. Kept apart from `spec.py`, which
`make native` compiles: these classes rebind their dunders, which stay a plain Python class's.
"""

from __future__ import annotations

from dataclasses import dataclass


class PeekError(RuntimeError):
    """A policy (or anything but the engine and the named oracle) tried to read a future length."""


class HiddenLength:
    """A trajectory's future length. Reading it without the key raises, so peeking cannot go unnoticed."""

    __slots__ = ("_value", "_key")

    def __init__(self, value: int, key: object) -> None:
        self._value = value
        self._key = key

    def reveal(self, key: object) -> int:
        if key is not self._key:
            raise PeekError("the target length of a trajectory is hidden from policies")
        return self._value

    def _deny(self, *_args, **_kwargs):
        raise PeekError("the target length of a trajectory is hidden from policies")

    __int__ = __index__ = __float__ = __bool__ = __eq__ = __lt__ = __le__ = __gt__ = __ge__ = _deny
    __add__ = __radd__ = __sub__ = __rsub__ = _deny
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "HiddenLength(<sealed>)"


@dataclass(frozen=True)
class Turn:
    """One agent turn: wait on a tool, append its observation, then decode a reply."""

    observation_len: int
    tool_latency_s: float
    response: HiddenLength


class SealedTurns:
    """A trajectory's later turns: how many, each tool's wait and observation, each reply. The
    environment's future, sealed like a length: only the backend, which plays the environment, and
    a named oracle hold the key. Counting, indexing or iterating them without it raises."""

    __slots__ = ("_turns", "_key")

    def __init__(self, turns: tuple[Turn, ...], key: object) -> None:
        self._turns = turns
        self._key = key

    def reveal(self, key: object) -> tuple[Turn, ...]:
        if key is not self._key and self is not NO_TURNS:
            raise PeekError("the later turns of a trajectory are hidden from policies")
        return self._turns

    def _deny(self, *_args, **_kwargs):
        raise PeekError("the later turns of a trajectory are hidden from policies")

    __len__ = __iter__ = __getitem__ = __bool__ = __contains__ = __eq__ = _deny
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "SealedTurns(<sealed>)"


NO_TURNS = SealedTurns((), None)
"""No sealed future at all (a hand-built or live request): nothing to hide, so any key reads it. A
generated single-turn trajectory gets its own sealed empty turns instead, so that neither `is
NO_TURNS` nor a keyless read tells a policy whether a session has turns left."""
