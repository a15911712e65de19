"""Seeded rollout workloads: grouped prompts, long-tailed responses, optional multi-turn sessions.

The target length of each trajectory is sealed in a `HiddenLength`: only the backend (which plays
the engine that decides when EOS happens) and an explicitly named oracle hold the key to read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cadencerl.config import ClassSpec, ConfigError, LengthDist, WorkloadSpec


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


@dataclass(frozen=True)
class TrajectorySpec:
    """What the trainer submits: observable prompt facts plus sealed future lengths."""

    id: int
    group: int
    prompt_len: int
    response: HiddenLength  # first (or only) reply
    workload_class: str = "rlvr"
    later_turns: tuple[Turn, ...] = field(default=())


def total_tokens(spec: TrajectorySpec, key: object) -> int:
    """The KV a trajectory ends with: prompt, every reply and every observation (opens the seal)."""
    return spec.prompt_len + spec.response.reveal(key) + sum(t.observation_len + t.response.reveal(key)
                                                             for t in spec.later_turns)


def _lengths(rng: np.random.Generator, dist: LengthDist, n: int, shift: np.ndarray | float = 0.0) -> np.ndarray:
    body = rng.lognormal(np.log(dist.median) + shift, dist.sigma, n) if dist.sigma > 0 else np.full(n, dist.median * np.exp(shift))
    return np.clip(np.rint(body), dist.minimum, dist.cap).astype(int)


def generate(spec: WorkloadSpec, seed: int, key: object) -> list[TrajectorySpec]:
    """Sample `spec.trajectories` trajectories: each class gets its share, in groups that share a
    prompt and a difficulty; groups of all classes arrive interleaved in a seeded random order."""
    if spec.trace:
        return load_trace(spec.trace, key)
    rng = np.random.default_rng(seed)
    classes = spec.class_specs()
    counts = _split(spec.trajectories, {n: c.share for n, c in classes.items()})
    groups: list[list[TrajectorySpec]] = []
    for name, cls in classes.items():
        groups += _sample_class(rng, name, cls, counts[name], len(groups), key)
    order = rng.permutation(len(groups)) if len(classes) > 1 else range(len(groups))
    out: list[TrajectorySpec] = []
    for gi in order:
        for t in groups[gi]:
            out.append(TrajectorySpec(len(out), t.group, t.prompt_len, t.response, t.workload_class, t.later_turns))
    return out


def _split(total: int, shares: dict[str, float]) -> dict[str, int]:
    """Largest-remainder split of `total` by `shares`."""
    s = sum(shares.values())
    raw = {k: total * v / s for k, v in shares.items()}
    counts = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: raw[k] - counts[k], reverse=True)[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


def _sample_class(rng: np.random.Generator, name: str, cls: ClassSpec, n: int,
                  first_group: int, key: object) -> list[list[TrajectorySpec]]:
    if n == 0:
        return []
    g = cls.group_size
    n_groups = -(-n // g)
    prompt = _lengths(rng, cls.prompt, n_groups)
    difficulty = rng.normal(0.0, cls.prompt_difficulty_sigma, n_groups) if cls.prompt_difficulty_sigma \
        else np.zeros(n_groups)
    group_of = np.arange(n) // g
    response = _lengths(rng, cls.response, n, difficulty[group_of])
    out: list[list[TrajectorySpec]] = [[] for _ in range(n_groups)]
    for i in range(n):
        turns: tuple[Turn, ...] = ()
        if cls.turns is not None and cls.turns.turns_max > 1:
            t = cls.turns
            k = int(rng.integers(t.turns_min, t.turns_max + 1)) - 1
            obs = _lengths(rng, t.observation, k)
            tool = rng.lognormal(np.log(max(t.tool_latency_median_s, 1e-9)), t.tool_latency_sigma, k)
            replies = _lengths(rng, cls.response, k, difficulty[group_of[i]])
            turns = tuple(Turn(int(o), float(s), HiddenLength(int(r), key)) for o, s, r in zip(obs, tool, replies))
        gi = int(group_of[i])
        out[gi].append(TrajectorySpec(-1, first_group + gi, int(prompt[gi]), HiddenLength(int(response[i]), key),
                                      name, turns))
    return out


def load_trace(path: str | Path, key: object, workload_class: str = "rlvr") -> list[TrajectorySpec]:
    """Replay a JSONL trace of `{prompt_len, response_len, group, turns: [{observation_len, tool_latency_s, response_len}]}`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"workload.trace: no such file {str(path)!r}")
    out: list[TrajectorySpec] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"workload.trace: {path.name} line {lineno}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"workload.trace: {path.name} line {lineno}: expected an object")
        prompt = _positive_int(rec, "prompt_len", path, lineno)
        response = _positive_int(rec, "response_len", path, lineno)
        group = rec.get("group", lineno - 1)
        if not isinstance(group, int) or isinstance(group, bool) or group < 0:
            raise ConfigError(f"workload.trace: {path.name} line {lineno}: field 'group' must be a non-negative integer")
        turns = []
        for j, t in enumerate(rec.get("turns", [])):
            if not isinstance(t, dict):
                raise ConfigError(f"workload.trace: {path.name} line {lineno}: turns.{j} must be an object")
            obs = _positive_int(t, "observation_len", path, lineno, f"turns.{j}.")
            rsp = _positive_int(t, "response_len", path, lineno, f"turns.{j}.")
            tool = t.get("tool_latency_s", 0.0)
            if not isinstance(tool, (int, float)) or isinstance(tool, bool) or tool < 0:
                raise ConfigError(f"workload.trace: {path.name} line {lineno}: field 'turns.{j}.tool_latency_s' must be >= 0")
            turns.append(Turn(obs, float(tool), HiddenLength(rsp, key)))
        out.append(TrajectorySpec(len(out), group, prompt, HiddenLength(response, key),
                                  str(rec.get("class", workload_class)), tuple(turns)))
    if not out:
        raise ConfigError(f"workload.trace: {path.name} has no trajectories")
    return out


def _positive_int(rec: dict, name: str, path: Path, lineno: int, prefix: str = "") -> int:
    value = rec.get(name)
    if value is None:
        raise ConfigError(f"workload.trace: {path.name} line {lineno}: missing field '{prefix}{name}'")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"workload.trace: {path.name} line {lineno}: field '{prefix}{name}' must be a positive integer")
    return value
