"""Over-commit when it pays: a hill climb on MISA-T's KV bands that follows measured goodput.

`boost` multiplies MISA-T's KV bands; at every publish the pool's decode goodput over the iteration
just ended is compared with the one before (one step an iteration: shorter windows swing with the
cohort's phase), perturb and observe, stepping back to boost 1 within the deadband and probing up
again after a hold. Observable signals only: tokens streamed back, no lengths. Why and what was
measured: docs/policies/misa-t.md, "The goodput variant".
"""

from __future__ import annotations

from dataclasses import dataclass

STEP = 1.5          # multiplicative step of the boost: large enough that its effect beats the noise
MAX_BOOST = 3.0     # bands at most this times MISA-T's (HIGH x 3 is past any KV the pool holds)
DEADBAND = 0.01     # a change within +-1% reads as flat (one iteration's goodput varies 3.6-10.5% at a
                    # fixed boost on the 50-batch pools: a single reading decides little; MISA-T README)
MAX_HOLD = 8        # iterations at boost 1 after failed probes (doubling from 1): a probe costs


@dataclass
class GoodputClimb:
    """The boost on MISA-T's KV bands and the goodput measured at the last step."""

    boost: float = 1.0
    direction: int = 1
    last_rate: float | None = None
    _since: float | None = None     # the publish that started the iteration being measured
    _tokens_since: int = 0
    _version: int = 0
    _hold: int = 0                  # iterations left at boost 1 before the next probe
    _backoff: int = 1               # the hold after the next failed probe

    def look(self, now: float, decoded: int, version: int) -> float:
        """The boost for now, given the pool's cumulative decoded tokens and the trainer's version;
        steps once an iteration (the first, admitted before anything was measured, is skipped)."""
        if version == self._version:
            return self.boost
        self._version = version
        if self._since is None or now <= self._since:
            self._since, self._tokens_since = now, decoded
            return self.boost
        rate = (decoded - self._tokens_since) / (now - self._since)
        self._since, self._tokens_since = now, decoded
        last, self.last_rate = self.last_rate, rate
        if self.boost <= 1.0 and self._hold > 0:
            self._hold -= 1
            return self.boost
        direction = next_direction(self.direction, self.boost, last, rate)
        if direction > 0 and self.direction > 0 and self.boost > 1.0:
            self._backoff = 1                                   # over-commit paid: probe freely again
        self.direction = direction
        self.boost = min(MAX_BOOST, max(1.0, self.boost * STEP ** direction))
        if self.boost <= 1.0 and direction < 0:                # a probe that did not pay: wait longer
            self._hold, self._backoff = self._backoff, min(MAX_HOLD, 2 * self._backoff)
        return self.boost


def next_direction(direction: int, boost: float, last: float | None, rate: float) -> int:
    """Keep a step that raised goodput, reverse one that lowered it, lean toward boost 1 on a flat
    reading, and probe up from boost 1 (the only way to learn that over-commit pays)."""
    if boost <= 1.0:
        return 1
    if last is None or rate > last * (1 + DEADBAND):
        return direction
    if rate < last * (1 - DEADBAND):
        return -direction
    return -1
