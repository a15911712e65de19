"""What every command shares: the one-line error (exit code 2), scenario loading, progress bars, JSON output.

The command modules (`sim.py`, `engine.py`) import from here; `main.py` assembles them into the app.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cadencerl.config import ConfigError, Scenario, builtin_scenario, load_scenario_file

ScenarioOpt = typer.Option(None, "--scenario", "-s", help="built-in scenario name (see `cadencerl scenarios`)")
ConfigOpt = typer.Option(None, "--config", "-c", help="a scenario file (YAML or TOML)")
JsonOpt = typer.Option(None, "--json", help="write the figures as JSON to PATH, or '-' for stdout only")


def fail(message: str) -> None:
    """Print one red line naming the field and exit with code 2 (bad input)."""
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def load_scenario(name: Optional[str], config: Optional[Path], overrides: dict) -> Scenario:
    """The scenario named by exactly one of --scenario / --config, with the command-line overrides applied."""
    if (name is None) == (config is None):
        fail("give exactly one of --scenario NAME or --config FILE")
    try:
        s = builtin_scenario(name) if name else load_scenario_file(config)
        changes: dict = {}
        for section, key, value in (("workload", "trajectories", overrides.get("trajectories")),
                                    ("policy", "eta", overrides.get("eta")),
                                    ("policy", "delta", overrides.get("delta"))):
            if value is not None:
                changes.setdefault(section, {})[key] = value
        if overrides.get("seed") is not None:
            changes["seed"] = overrides["seed"]
        return s.with_overrides(**changes) if changes else s
    except ConfigError as exc:
        fail(str(exc))


def progress_bar(enabled: bool) -> Progress:
    """A transient bar on stderr, so stdout stays clean for `--json -`."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True, disable=not enabled)


def write_json(target: Optional[str], payload) -> None:
    """Write `payload` to the file `target`, or to stdout when it is '-'; nothing when it is None."""
    if target is None:
        return
    text = json.dumps(payload, indent=2)
    if target == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text + "\n")


def int_list(name: str, text: str, minimum: int = 0) -> list[int]:
    """A comma-separated list of integers >= `minimum`, or a one-line error naming the option."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        fail(f"{name}: expected comma-separated integers >= {minimum}, got {text!r}")
    return values
