"""Section 12: which results moved, and by how much, when the simulator changed (issue 11).

The report does not run these: `benchmarks/simulator_change.py` runs one scenario under two git
revisions, each through its own CLI, and writes `benchmarks/results/simulator_change.json`; this
section renders that file as measured, with the revisions and the commands. The default new revision
is the current code, so policy changes made since ride along; `simulator_change_isolated.json`, the
same run with `--new` at the merge that brought the simulator change, says what it alone moved.
"""

from __future__ import annotations

import json
from pathlib import Path

from cadencerl.report.context import Report
from cadencerl.report.markdown import change, md_table, sec, tok

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "simulator_change.json"
ISOLATED = RESULTS.with_name("simulator_change_isolated.json")   # the same, new = the merge of the change alone
MOVED = 0.01   # runs are deterministic, so every difference is real; under 1% is called unchanged
HEADING = "## 12. What moved with the simulator change (issue 11)\n"


def simulator_change(ctx: Report) -> str:
    """Section 12, from the benchmark's JSON (a checkout without it says how to produce it)."""
    if not RESULTS.is_file():
        return "\n".join([HEADING, f"Not measured in this checkout (`{RESULTS.name}` is missing): run "
                          "`python benchmarks/simulator_change.py`.\n"])
    isolated = json.loads(ISOLATED.read_text()) if ISOLATED.is_file() else None
    return render(json.loads(RESULTS.read_text()), isolated)


def _moves(name: str, unit: str, old: float, new: float) -> tuple[bool, str]:
    fmt = tok if unit == "tok/s" else sec
    return abs(new / old - 1) >= MOVED if old else new != old, f"{name} {change(new, old)} ({fmt(old)} -> {fmt(new)} {unit})"


def render(data: dict, isolated: dict | None = None) -> str:
    """The table of both revisions' figures, then in words what moved by 1% or more and what did not
    (and, from `isolated`, how much of each throughput move the simulator change alone makes)."""
    old, new = data["old"], data["new"]
    rows, moved, still = [], [], []
    for p in data["policies"]:
        o, n = old["results"][p], new["results"][p]
        rows.append([p, tok(o["throughput_tok_s"]), tok(n["throughput_tok_s"]),
                     change(n["throughput_tok_s"], o["throughput_tok_s"]), sec(o["latency_p95_s"]),
                     sec(n["latency_p95_s"]), change(n["latency_p95_s"], o["latency_p95_s"])])
        for label, key, unit in (("throughput", "throughput_tok_s", "tok/s"), ("P95", "latency_p95_s", "s")):
            is_moved, text = _moves(f"{p} {label}", unit, o[key], n[key])
            (moved if is_moved else still).append(text)
    rows.append(["**bound**", tok(old["bound_throughput_tok_s"]), tok(new["bound_throughput_tok_s"]),
                 change(new["bound_throughput_tok_s"], old["bound_throughput_tok_s"]),
                 sec(old["bound_latency_p95_s"]), sec(new["bound_latency_p95_s"]),
                 change(new["bound_latency_p95_s"], old["bound_latency_p95_s"])])
    _, bound = _moves("the throughput bound", "tok/s", old["bound_throughput_tok_s"], new["bound_throughput_tok_s"])
    size = old["scenario"]
    return "\n".join([
        HEADING,
        f"Scenario {data['scenario']} ({size['trajectories']:,} trajectories, trainer batch {size['batch_size']}, "
        f"seed {size['seed']}, {size['model']}), every policy with its built-in settings, whole-run figures. "
        f"Old: `{old['revision'][:10]}` ({old['subject']}). New: `{new['revision'][:10]}` ({new['subject']}). "
        f"Each ran in its own checkout: old `{old['command']}` ({old['wall_s']:.0f} s), new `{new['command']}` "
        f"({new['wall_s']:.0f} s). Reproduce: `{data['command']}`.\n",
        md_table(["policy", "old tok/s", "new tok/s", "change", "old P95 s", "new P95 s", "change"], rows), "",
        f"- **Moved by {100 * MOVED:.0f}% or more:** " + ("; ".join(moved) if moved else "nothing") + ".",
        f"- **Within {100 * MOVED:.0f}%:** " + ("; ".join(still) if still else "nothing") + ".",
        f"- **Bound:** {bound}; it is the tightened bound in the new revision (`runs/bounds.py`).",
        _between(data.get("between", {})), *([_alone(isolated)] if isolated else []), ""])


def _alone(iso: dict) -> str:
    """One line: each policy's throughput move with the simulator change alone (no other change between)."""
    old, new = iso["old"], iso["new"]
    moves = [f"{p} {change(new['results'][p]['throughput_tok_s'], old['results'][p]['throughput_tok_s'])} "
             f"({tok(old['results'][p]['throughput_tok_s'])} -> {tok(new['results'][p]['throughput_tok_s'])})"
             for p in iso["policies"]]
    return (f"- **The simulator change alone** (`{old['revision'][:10]}` -> `{new['revision'][:10]}`, {new['subject']}; "
            f"`{iso['command']}`), throughput in tok/s: {'; '.join(moves)}. A move in the table that is not here "
            "comes from the other changes.")


def _between(between: dict) -> str:
    """What else lies between the revisions, so a policy's move is not read as the simulator's alone."""
    files = between.get("policy_files", [])
    if not files:
        return "- **Other changes:** none to the policies between the two revisions."
    return (f"- **Other changes:** {between.get('commits', '?')} commits lie between the revisions, and these policy "
            f"files changed too: {', '.join(f'`{f}`' for f in files)}; where a policy's own code changed, its move is "
            "not the simulator's alone (`--new` at the merge of the simulator change isolates it).")
