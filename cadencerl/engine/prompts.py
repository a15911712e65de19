"""Seeded synthetic token ids for runs whose workload has lengths but no text.

Every sample of a group shares its prompt (so placement can exploit the prefix cache), and a tool
observation is fixed by (seed, trajectory, turn), so a rerun sends the servers the same ids.
"""

from __future__ import annotations

import numpy as np

VOCAB = 4096   # ids 1..VOCAB-1; the tiny model (devpool/tiny_model.py) is built with this vocabulary



def synthetic_prompt(seed: int, group: int, length: int, vocab: int = VOCAB) -> list[int]:
    """Seeded random prompt ids; every sample of a group shares them (a longer one extends them)."""
    return np.random.default_rng([seed, group]).integers(1, vocab, length).tolist()


def synthetic_observation(seed: int, traj_id: int, turn: int, length: int,
                          vocab: int = VOCAB) -> list[int]:
    """The ids a tool returns to trajectory `traj_id` before turn `turn`."""
    return np.random.default_rng([seed, 1, traj_id, turn]).integers(1, vocab, length).tolist()
