"""What moved when the simulator changed: one scenario and the same policies under two revisions.

Usage: python benchmarks/simulator_change.py [--old REV] [--new REV] [--scenario 16a16b8h]
           [--policies cadence,sync,one-off,laminar,areal,least-loaded] [--trajectories N]
           [--timeout S] [--out benchmarks/results/simulator_change.json]

Each revision is checked out into a temporary `git worktree` (removed afterwards) and runs its own
`cadencerl compare` (`--no-reference` where that CLI has the clairvoyant reference: it is not what is
compared). `--trajectories N` shrinks the built-in scenario with the batch scaled alike (the same
number of iterations); older CLIs cannot scale the batch, so each revision writes that scenario to a
file with its own config code and runs `compare --config FILE`. It writes the revisions, the command
each ran, per-policy throughput and P95 latency and the bound to `--out` (JSON, read by the report's
section 12) and prints a table.

The default old revision, c3998628, is main just before the simulator changes of issue 11 landed
(`git log --oneline -- cadencerl/sim`: merge 1e8b3f1 "Merge sim: chunked prefill, weight sync, KV
staging ..., tighter bound, clairvoyant reference" has it as first parent). Everything else merged
between the two revisions is listed in the JSON (`between`), so a move is not read as the
simulator's when a policy changed too. `--new 1e8b3f1 --out benchmarks/results/simulator_change_isolated.json`
measures the simulator change alone (that merge's diff from the old revision is the simulator branch).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OLD = "c3998628a730674cc1e395ab059dd4f86d072d4a"
DEFAULT_POLICIES = "cadence,sync,one-off,laminar,areal,least-loaded"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "simulator_change.json"
# the built-in scenario resized (trajectories, batch), written by the revision's own config code
RESIZE = ("import sys, yaml; from cadencerl.config import builtin_scenario; s = builtin_scenario(sys.argv[1]); "
          "s = s.with_overrides(workload={'trajectories': int(sys.argv[2])}, trainer={'batch_size': int(sys.argv[3])}); "
          "open(sys.argv[4], 'w').write(yaml.safe_dump(s.model_dump(mode='json', exclude_none=True), sort_keys=False))")
FIGURES = ("throughput_tok_s", "latency_p95_s", "preemptions", "sim_time_s", "wall_time_s")
BOUND = ("bound_throughput_tok_s", "bound_latency_p95_s")
# what the checked-out revision says its built-in scenario is (and that its own package was imported)
PROBE = ("import json, sys, cadencerl; from cadencerl.config import builtin_scenario; s = builtin_scenario(sys.argv[1]); "
         "print(json.dumps({'package': cadencerl.__file__, 'trajectories': s.workload.trajectories, "
         "'batch_size': s.trainer.batch_size, 'seed': s.seed, 'model': s.model}))")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def describe(rev: str) -> dict:
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    return {"revision": sha, "subject": git("log", "-1", "--format=%s", sha), "date": git("log", "-1", "--format=%cI", sha)}


def between(old: str, new: str) -> dict:
    """What else changed from `old` to `new`: commits, merges, the simulator's commits, and the policy
    and routing files that changed (a policy's move is not the simulator's alone if its code changed)."""
    lines = lambda *a: [x for x in git("log", "--format=%h %s", *a).splitlines() if x]  # noqa: E731
    files = git("diff", "--name-only", old, new, "--", "cadencerl/policies", "cadencerl/admission").splitlines()
    return {"commits": len(lines(f"{old}..{new}")), "merges": lines("--merges", f"{old}..{new}"),
            "simulator_commits": lines("--no-merges", f"{old}..{new}", "--", "cadencerl/sim", "cadencerl/hardware"),
            "policy_files": [f for f in files if f]}


def run_revision(rev: dict, scenario: str, policies: list[str], trajectories: int | None, timeout: float) -> dict:
    """Check `rev` out into a temporary worktree, run its own `compare`, and return its figures."""
    tmp = Path(tempfile.mkdtemp(prefix="cadencerl-simchange-"))
    tree, out = tmp / "tree", tmp / "results.json"
    git("worktree", "add", "--detach", str(tree), rev["revision"])
    try:
        env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
        call = lambda args, limit: subprocess.run(args, cwd=tree, env=env, capture_output=True,  # noqa: E731
                                                  text=True, timeout=limit)
        probe = json.loads(call([sys.executable, "-c", PROBE, scenario], 120).stdout)
        if not Path(probe["package"]).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"revision {rev['revision'][:8]}: imported {probe['package']}, not its own checkout")
        flags = call([sys.executable, "-m", "cadencerl.cli", "compare", "--help"], 120).stdout
        args = ["compare", "-s", scenario]
        if trajectories is not None:
            batch = max(1, min(trajectories, round(probe["batch_size"] * trajectories / probe["trajectories"])))
            probe.update(trajectories=trajectories, batch_size=batch)
            made = call([sys.executable, "-c", RESIZE, scenario, str(trajectories), str(batch), str(tmp / "s.yaml")], 120)
            if made.returncode != 0:
                raise SystemExit(f"revision {rev['revision'][:8]}: cannot write the resized scenario: {made.stderr[-300:]}")
            args = ["compare", "--config", f"{scenario}-{trajectories}.yaml"]
            (tmp / "s.yaml").rename(tree / args[-1])
        args += ["--policies", ",".join(policies)]
        if "--no-reference" in flags:
            args.append("--no-reference")
        started = time.perf_counter()
        done = call([sys.executable, "-m", "cadencerl.cli", *args, "--json", str(out)], timeout)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"revision {rev['revision'][:8]}: compare failed (exit {done.returncode}): "
                             f"{done.stderr.strip().splitlines()[-1:] or done.stdout[-300:]}")
        results = json.loads(out.read_text())
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    first = results[0]
    return {**rev, "command": "cadencerl " + shlex.join(args), "wall_s": round(wall, 1),
            "scenario": {k: v for k, v in probe.items() if k != "package"},
            "results": {r["policy"]: {k: r[k] for k in FIGURES if k in r} for r in results},
            **{k: first[k] for k in BOUND if k in first}}


def print_table(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from cadencerl.report.markdown import (
        change,  # the report's own "+x.y%" of one figure against another
    )

    old, new = data["old"], data["new"]
    table = Table(title=f"{data['scenario']}: {old['revision'][:8]} (old) -> {new['revision'][:8]} (new)")
    for col in ("policy", "old tok/s", "new tok/s", "change", "old P95 s", "new P95 s", "change"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for p in data["policies"]:
        o, n = old["results"][p], new["results"][p]
        table.add_row(p, f"{o['throughput_tok_s']:,.0f}", f"{n['throughput_tok_s']:,.0f}",
                      change(n["throughput_tok_s"], o["throughput_tok_s"]), f"{o['latency_p95_s']:.1f}",
                      f"{n['latency_p95_s']:.1f}", change(n["latency_p95_s"], o["latency_p95_s"]))
    table.add_row("bound", f"{old['bound_throughput_tok_s']:,.0f}", f"{new['bound_throughput_tok_s']:,.0f}",
                  change(new["bound_throughput_tok_s"], old["bound_throughput_tok_s"]),
                  f"{old['bound_latency_p95_s']:.1f}", f"{new['bound_latency_p95_s']:.1f}",
                  change(new["bound_latency_p95_s"], old["bound_latency_p95_s"]))
    table.caption = f"old: {old['command']} ({old['wall_s']} s)\nnew: {new['command']} ({new['wall_s']} s)"
    Console(width=160).print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default=DEFAULT_OLD, help="revision with the previous simulator")
    ap.add_argument("--new", default="HEAD", help="revision with the new simulator")
    ap.add_argument("--scenario", default="16a16b8h")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--trajectories", type=int, default=None, help="default: the scenario's own")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per revision's compare")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args()
    if a.trajectories is not None and a.trajectories < 1:
        ap.error(f"--trajectories: must be at least 1, got {a.trajectories}")
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    if not policies:
        ap.error("--policies: give at least one policy name")
    try:
        old, new = describe(a.old), describe(a.new)
    except subprocess.CalledProcessError:
        ap.error(f"--old/--new: {a.old!r} or {a.new!r} is not a commit of {REPO}")
    data = {"benchmark": "benchmarks/simulator_change.py", "command": shlex.join(["python", *sys.argv]),
            "scenario": a.scenario, "policies": policies, "cpus": os.cpu_count(),
            "load_average_at_start": list(os.getloadavg()), "between": between(old["revision"], new["revision"])}
    data["old"] = run_revision(old, a.scenario, policies, a.trajectories, a.timeout)
    data["new"] = run_revision(new, a.scenario, policies, a.trajectories, a.timeout)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(data, indent=1) + "\n")
    print_table(data)
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
