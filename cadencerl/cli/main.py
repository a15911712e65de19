"""The `cadencerl` command line. Bad input gets one line naming the field, and exit code 2; an
internal failure gets one line saying it is a bug, and exit code 1.

This module only assembles the app: simulator commands come from `sim.py` and `plan.py`, real-engine commands
from `engine.py` and `pool.py`, the router service from `router.py`, and what they share from `common.py`.
"""

from __future__ import annotations

import typer
from typer.core import TyperCommand, TyperGroup

from cadencerl import __version__
from cadencerl.cli import engine, plan, pool, router, sim
from cadencerl.cli.common import UsageError, guarded


class _OneLineErrors:
    """Click's own refusals (a bad option value, an unknown option) as one line: `Error: ...`,
    without the usage text and hint that would surround it."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:
            exc.ctx = None
            raise


class Command(_OneLineErrors, TyperCommand):
    pass


class Group(_OneLineErrors, TyperGroup):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as exc:   # an unknown command name
            exc.ctx = None
            raise


def build_app() -> typer.Typer:
    """The app with every command, in the order `--help` lists them."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      rich_markup_mode=None, cls=Group,
                      help="CadenceRL: rollout control plane for asynchronous RL post-training.")
    app.callback()(_version_option)
    for command in (sim.sim, sim.compare, sim.sensitivity, sim.sweep, plan.plan, sim.scenarios, sim.report):
        app.command(cls=Command)(guarded(command))
    pools = typer.Typer(no_args_is_help=True, help=pool.POOL_HELP, cls=Group)
    pools.command("up", cls=Command)(guarded(pool.pool_up))
    pools.command("down", cls=Command)(guarded(pool.pool_down))
    app.add_typer(pools, name="pool")
    app.command("run", cls=Command)(guarded(engine.run))
    app.command("calibrate", cls=Command)(guarded(engine.calibrate))
    app.command("router", cls=Command)(guarded(router.router))
    return app


def _show_version(given: bool) -> None:
    if given:
        print(f"cadencerl {__version__}")
        raise typer.Exit()


def _version_option(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                                 help="print the installed version and exit")) -> None:
    """The options of `cadencerl` itself (the app's help text is `build_app`'s)."""


app = build_app()


def main() -> None:
    """The console script. Ctrl-C is `guarded`'s to report: typer turns it into exit 130 before here."""
    app()


if __name__ == "__main__":
    main()
