"""Seeded rollout workloads: grouped prompts, long-tailed responses, optional multi-turn sessions."""

from __future__ import annotations

import numpy as np

from cadencerl.config import MAX_SECONDS, ClassSpec, LengthDist, WorkloadSpec
from cadencerl.core.spec import HiddenLength, SealedTurns, TrajectorySpec, Turn
from cadencerl.workload.trace import load_trace


def _lengths(rng: np.random.Generator, dist: LengthDist, n: int, shift: np.ndarray | float = 0.0) -> np.ndarray:
    body = rng.lognormal(np.log(dist.median) + shift, dist.sigma, n) if dist.sigma > 0 else np.full(n, dist.median * np.exp(shift))
    return np.clip(np.rint(body), dist.minimum, dist.cap).astype(int)


def generate(spec: WorkloadSpec, seed: int, key: object) -> list[TrajectorySpec]:
    """Sample `spec.trajectories` trajectories: each class gets its share, in groups that share a
    prompt and a difficulty; groups of all classes arrive interleaved in a seeded random order."""
    if spec.trace:
        return load_trace(spec.trace, key, limit=spec.trajectories, classes=set(spec.target_mix()))
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
        turns = SealedTurns((), key)
        if cls.turns is not None and cls.turns.turns_max > 1:
            t = cls.turns
            k = int(rng.integers(t.turns_min, t.turns_max + 1)) - 1
            obs = _lengths(rng, t.observation, k)
            tool = np.minimum(rng.lognormal(np.log(max(t.tool_latency_median_s, 1e-9)), t.tool_latency_sigma, k),
                              MAX_SECONDS)  # a far tail draw stays a day, so virtual time keeps its resolution
            replies = _lengths(rng, cls.response, k, difficulty[group_of[i]])
            turns = SealedTurns(tuple(Turn(int(o), float(s), HiddenLength(int(r), key))
                                      for o, s, r in zip(obs, tool, replies)), key)
        gi = int(group_of[i])
        out[gi].append(TrajectorySpec(-1, first_group + gi, int(prompt[gi]), HiddenLength(int(response[i]), key),
                                      name, turns))
    return out
