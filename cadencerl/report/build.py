"""`cadencerl report`: the paper's section-6 evaluation matrix, run on seeded workloads in the simulator.

`build_report(out)` writes `out/report.md` (tables, captions, the setup of every experiment and the
command that reproduces each row), `out/figures/*.png`, `out/results.json` (every run's figures, as
`simulate` returned them, plus the setup it ran under) and `out/scenarios/*.yaml` (every scenario
that is not a built-in one, so `cadencerl sim/compare --config` can rerun it).

Numbers are reported as measured. Ratios compare CadenceRL with the best of *all* other policies
run on the same pool (least-loaded included), so a loss anywhere shows up as a loss.

One function per experiment (`report/sections/`: `homogeneous`, `heterogeneous`, ...): each takes the
`Report` context (`report/context.py`), runs what it needs through its cached `Runner`
(`report/runner.py`), and returns its markdown section. What runs is defined in `report/matrix.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from cadencerl.report.context import Report
from cadencerl.report.matrix import DETAIL_POOL, STEADY_ITERATIONS, make_settings, planned_runs, pool_scenario
from cadencerl.report.runner import ReportError, Runner, progress_bar
from cadencerl.report.sections import EXPERIMENTS
from cadencerl.report.sections.pools import HETEROGENEOUS_RATIO_TABLE_HEADER, light_load
from cadencerl.runs.outputs import fresh_dir


def _common_setup(ctx: Report) -> str:
    s = pool_scenario(DETAIL_POOL, ctx.settings)
    w, t, c, k = s.workload, s.trainer, s.controller, s.cadence
    mode = (f"quick (`--quick`): every pool at 1/{ctx.settings.pool_scale} of its devices, every run "
            f"{STEADY_ITERATIONS} iterations of a trainer batch of {t.batch_size} instead of 4096, so each worker "
            "carries the full report's KV pressure in a run of seconds; the fewer workers leave concentration less "
            "room, so quote the full report's numbers"
            if ctx.settings.quick and not ctx.settings.sized else
            f"sized (`--trajectories {w.trajectories}`): smaller runs than the full report's; quote the full "
            "report's numbers" if ctx.settings.sized else "full")
    return "\n".join([
        "## Setup common to every experiment\n",
        f"- Mode: {mode}. Every run: {w.trajectories} trajectories, trainer batch {t.batch_size} "
        f"({w.trajectories // t.batch_size} iterations), train time {t.train_time_s:g} s per iteration, seed {s.seed} "
        f"(the same seed gives the same workload under every policy).",
        f"- Workload: groups of {w.group_size} samples per prompt; prompt log-normal median {w.prompt.median:g}, "
        f"sigma {w.prompt.sigma:g}, cap {w.prompt.cap}; response log-normal median {w.response.median:g}, sigma "
        f"{w.response.sigma:g}, cap {w.response.cap} tokens; prompt difficulty sigma {w.prompt_difficulty_sigma:g}; "
        "single turn.",
        f"- Policy knobs unless an experiment says otherwise: eta {c.eta}, delta {k.delta} tokens, headroom floor "
        f"{k.headroom_floor:g}, decision tick {c.tick_s:g} s, KV preparation {'on' if k.kv_preparation else 'off'}.",
        "- Simulator: the closed-form discrete-event pool simulator (`cadencerl/sim`), each worker a vLLM V1 "
        "engine (max_num_seqs 256, preemption by recompute); roofline step times from `cadencerl/hardware`.",
        f"- Steady state: every figure in the tables is measured over the steady window, from the end of the first "
        f"training iteration to the start of the last ({STEADY_ITERATIONS - 2} of {STEADY_ITERATIONS} iterations: the "
        "pool filling up and the final drain are left out). Throughput = tokens decoded in the window / its length; "
        "latency and non-resident time over the trajectories completed in it. Whole-run figures are in `results.json`.",
        "- Latency = admission to completion (waiting included); latency from submission starts when the trajectory "
        "became available to the controller (the eta budget let it start: trajectory i of batch B once version "
        "i // B - eta is published), so a policy cannot look faster by holding work back.",
        "- Reproduce: every table gives the `cadencerl sim` / `cadencerl compare` command for its rows; scenario "
        "files that are not built-ins are written to `scenarios/`. `results.json` holds every run's full figures "
        "with the setup it ran under (key `setup`).\n"])


def _losses_section(ctx: Report) -> str:
    def bullets(items: list[str]) -> str:
        return "\n".join(f"- {x}" for x in dict.fromkeys(items)) if items else "- None in this matrix."
    return "\n".join(["### Where CadenceRL loses to a baseline (as measured)\n", bullets(ctx.losses), "",
                      "### Paper claims this simulation does not reproduce\n", bullets(ctx.mismatches), ""])


def render(ctx: Report, sections: list[str], light: str, wall_s: float) -> str:
    return "\n".join([
        "# CadenceRL evaluation report (simulated)\n",
        f"Generated by `{ctx.settings.command}`, following section 6 of "
        "the CadenceRL paper (see shared/papers/cadencerl-summary.txt). All numbers are measured in the simulator "
        f"on seeded workloads; nothing was tuned per policy. {len(ctx.runner.records)} runs, {wall_s:.0f} s wall "
        "time.\n",
        "## Headline: CadenceRL vs the best baseline on the heterogeneous pools\n",
        _headline_regime(ctx), HETEROGENEOUS_RATIO_TABLE_HEADER, ctx.headline, "", light,
        _losses_section(ctx), _common_setup(ctx), *sections])


def _headline_regime(ctx: Report) -> str:
    """What load the headline's pools carry, in a line."""
    s = ctx.settings
    if s.pool_scale > 1 and not s.sized:
        return (f"Each pool at 1/{s.pool_scale} of its devices with 1/{s.pool_scale} of the trainer batch ({s.batch_size}), "
                "so each worker carries the full report's KV pressure (the regime pacing and concentration are for), "
                "judged over the steady window.\n")
    return f"The pools as built in, trainer batch {s.batch_size or 4096}, judged over the steady window.\n"


REPORT_ENTRIES = ("report.md", "results.json", "figures", "scenarios")   # what a report directory holds


class OutputError(ReportError):
    """`--out` cannot take the report (bad input, unlike a failed run)."""


def check_out_dir(out: Path) -> None:
    """Before any work: `out` is new, empty or an earlier report (nothing else is replaced), it does
    not hold the current directory (it is replaced whole), and its parent is writable. An
    OutputError names `out` otherwise."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"out: {str(out)!r} exists and is not a directory")
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise OutputError(f"out: {str(out)!r} holds the current directory, and a report replaces its "
                          "directory whole; give a directory of its own (e.g. report)")
    if out.is_dir() and any(out.iterdir()):
        foreign = _not_a_report(out)
        if foreign:
            raise OutputError(f"out: {str(out)!r} holds files that are not a report ({', '.join(foreign[:3])}); "
                              "give a new or empty directory, or an earlier report's")
    parent = out.resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"out: cannot write to {str(parent)!r}")


def _not_a_report(out: Path) -> list[str]:
    """What in `out` a report would not have written: an earlier report has its report.md and
    results.json, and besides them only figures/*.png and scenarios/*.yaml."""
    foreign = sorted(p.name for p in out.iterdir() if p.name not in REPORT_ENTRIES)
    if foreign:
        return foreign
    missing = [f"no {name}" for name in ("report.md", "results.json") if not (out / name).is_file()]
    if missing:
        return missing
    for folder, suffix in (("figures", ".png"), ("scenarios", ".yaml")):
        if (out / folder).is_dir():
            foreign += [f"{folder}/{p.name}" for p in (out / folder).iterdir()
                        if not (p.is_file() and p.suffix == suffix)]
        elif (out / folder).exists():
            foreign.append(folder)
    return foreign


def _replace_dir(staging: Path, out: Path) -> None:
    """Swap the finished report in for `out` (renames on one file system): never half old, half new."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_report(out: str | Path, *, quick: bool = False, trajectories: int | None = None, seed: int | None = None,
                 progress: bool = True, processes: int | None = None) -> tuple[Path, list[list]]:
    """Run the matrix and write out/report.md, out/results.json, out/figures/ and out/scenarios/; returns
    report.md and the headline table's rows (headers: `sections.pools.RATIO_HEADERS`), for the terminal.

    The report is built in a staging directory beside `out` and swapped in whole at the end, so an
    earlier report in `out` is replaced, not mixed with (no stale figures), and a failed run leaves
    it as it was. `processes` (default: the CPU count) simulate the planned runs in parallel;
    results do not depend on it.
    """
    started = time.perf_counter()
    out = Path(out)
    check_out_dir(out)
    try:
        staging = fresh_dir(out.resolve().parent, f".{out.name}.staging-")
    except OSError as exc:
        raise OutputError(f"out: cannot write beside {str(out)!r}: {exc.strerror or exc}") from None
    try:
        settings = make_settings(quick, trajectories, seed)
        jobs = planned_runs(settings)
        with progress_bar(progress) as bar:
            runner = Runner(bar, planned=len(jobs) + 2)
            runner.prefetch(jobs, processes if processes is not None else (os.cpu_count() or 1))
            ctx = Report(staging, settings, runner, shown_out=out)
            sections = [experiment(ctx) for experiment in EXPERIMENTS]
            light = light_load(ctx)
        wall = time.perf_counter() - started
        try:
            (staging / "report.md").write_text(render(ctx, sections, light, wall))
            (staging / "results.json").write_text(json.dumps(
                {"mode": settings.mode, "command": settings.command, "wall_time_s": wall, "runs": runner.records},
                indent=1) + "\n")
            _replace_dir(staging, out)
        except OSError as exc:
            raise OutputError(f"out: cannot write to {str(out)!r}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / "report.md", ctx.headline_rows
