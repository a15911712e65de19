"""The `cadencerl` command line. Bad input gets one line naming the field, and exit code 2; an
internal failure gets one line saying it is a bug, and exit code 1.

This module only assembles the app: simulator commands come from `sim.py`, real-engine commands
from `engine.py`, and what they share from `common.py`.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from cadencerl.cli import engine, sim
from cadencerl.cli.common import guarded


def build_app() -> typer.Typer:
    """The app with every command, in the order `--help` lists them."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      rich_markup_mode=None,
                      help="CadenceRL: rollout control plane for asynchronous RL post-training.")
    for command in (sim.sim, sim.compare, sim.sensitivity, sim.sweep, sim.scenarios, sim.report):
        app.command()(guarded(command))
    pool = typer.Typer(no_args_is_help=True, help=engine.POOL_HELP)
    pool.command("up")(guarded(engine.pool_up))
    pool.command("down")(guarded(engine.pool_down))
    app.add_typer(pool, name="pool")
    app.command("run")(guarded(engine.run))
    app.command("calibrate")(guarded(engine.calibrate))
    return app


app = build_app()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
