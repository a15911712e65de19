"""The value types every scenario section is built from: strict, finite, inside sane ranges.

A scenario that validates also runs to completion in bounded time; the limits say what "sane" is.
Types are strict: `trajectories: true` or `devices: "8"` is an error, not a silent 1 or 8.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

MAX_TRAJECTORIES = 1_000_000      # a run's work grows with it; the built-ins use 16,384
MAX_TOKENS = 1 << 24              # any one length (16M tokens) or a KV cap
MAX_SECONDS = 86_400.0            # any one duration: a day of virtual time
MAX_SIGMA = 5.0                   # log-normal spread; exp(5) is already a factor of 148
MAX_WORKERS = 4096                # a pool's workers in all; every decision looks at every worker

_UNSAFE = re.compile(r"[\[\]/\\\x00-\x1f\x7f]")


def _safe_name(value: str) -> str:
    if _UNSAFE.search(value) or value.startswith("."):
        raise ValueError(f"{value!r} may not hold [ ] / \\ or control characters, nor start with '.'")
    return value


# A name shows up in tables, progress bars and cache file names: printable, no markup, no paths.
SafeName = Annotated[str, StringConstraints(min_length=1, max_length=80), AfterValidator(_safe_name)]
Count = Annotated[int, Field(gt=0, le=MAX_TRAJECTORIES)]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Sigma = Annotated[float, Field(ge=0, le=MAX_SIGMA)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
