"""A trainer process for the journal tests: the shrunk cpu-pair run through RolloutPool with a
journal, each batch written (one JSON line, fsynced) before it is published. Killed and restarted
by tests/test_journal_restart.py: `python tests/journal_driver.py URLS JOURNAL OUT [TRAJ] [BATCH] [TRAIN_S] [TURNS]`
(TURNS 1: multi-turn sessions, 2-3 turns each with a tool call between them)."""

from __future__ import annotations

import json
import os
import sys
import time

from cadencerl.api import RolloutPool
from cadencerl.config import builtin_scenario

MULTI_TURN = {"turns_min": 2, "turns_max": 3, "observation": {"median": 24, "sigma": 0.5, "cap": 64},
              "tool_latency_median_s": 0.15, "tool_latency_sigma": 0.5}


def scenario(trajectories: int, batch: int, turns: bool = False):
    workload = {"trajectories": trajectories, "response": {"median": 120, "sigma": 1.0, "cap": 400}}
    if turns:
        workload = {**workload, "response": {"median": 60, "sigma": 1.0, "cap": 200}, "turns": MULTI_TURN}
    return builtin_scenario("cpu-pair").with_overrides(
        workload=workload, trainer={"batch_size": batch}, cadence={"delta": 32, "headroom_floor": 0.15})


def main(urls: str, journal: str, out: str, trajectories: int = 32, batch: int = 8, train_s: float = 0.2,
         turns: int = 0) -> None:
    s = scenario(trajectories, batch, bool(turns))
    with RolloutPool.from_scenario(s, urls.split(","), policy="cadence", kv_tokens=1024, deadline_s=120,
                                   journal=journal) as pool, open(out, "a") as f:
        for b in pool.batches():
            f.write(json.dumps({"pid": os.getpid(), "index": b.index,
                                "samples": [[x.id, x.tag, x.prompt_ids, x.completion_ids] for x in b.samples]}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            time.sleep(train_s)
            pool.publish()
        result = pool.result()
        f.write(json.dumps({"pid": os.getpid(), "end": True, "journal": result.get("journal")}) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], args[2], *(int(a) for a in args[3:5]), *(float(a) for a in args[5:6]),
         *(int(a) for a in args[6:7]))
