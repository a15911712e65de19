"""What every command shares: the one-line error (exit code 2), scenario loading, progress bars, JSON output.

The command modules (`sim.py`, `engine.py`, `pool.py`, `ray_pool.py`, `router.py`) import from here; `main.py`
assembles them into the app.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.text import Text

from cadencerl.config import ConfigError, Scenario, builtin_scenario, load_scenario_file
from cadencerl.runs.outputs import write_atomic

# click's exception classes as typer uses them (typer >= 0.22 vendors its own click, older ones use click)
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def fail(message: str, code: int = 2) -> None:
    """Print one red line naming the field and exit with `code` (2: bad input). The message is plain
    text: a user's value in it (`[red]`, a URL in brackets) is printed as given, never as markup."""
    line = " ".join(str(message).split())
    Console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", line), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def bug(exc: BaseException) -> None:
    """An internal failure, not bad input: one line saying so, exit code 1."""
    line = " ".join(f"{type(exc).__name__}: {exc}".split())
    Console(stderr=True).print(Text.assemble(("internal error (a bug in CadenceRL; please report it):", "bold red"),
                                             " ", line), highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def given(field: str, hint: str) -> Callable:
    """An option callback refusing an empty value (`-s ""`, `--workers ","`): the commands take a
    falsy value for 'not given' and would otherwise fail later, far from the option."""
    def check(value: Optional[str]) -> Optional[str]:
        if value is not None and not any(part.strip() for part in str(value).split(",")):
            fail(f"{field}: {hint}")
        return value
    return check


ScenarioOpt = typer.Option(None, "--scenario", "-s", help="built-in scenario name (see `cadencerl scenarios`)",
                           callback=given("scenario", "give a built-in name (see `cadencerl scenarios`), "
                                                      "not an empty string"))
ConfigOpt = typer.Option(None, "--config", "-c", help="a scenario file (YAML or TOML)")
JsonOpt = typer.Option(None, "--json", help="write the figures as JSON to PATH, or '-' for stdout only",
                       callback=given("json", "give a file path or '-'"))
WorkersOpt = typer.Option(None, "--workers", help="server URLs, comma-separated",
                          callback=given("workers", "give server URLs, comma-separated, not an empty string"))


def guarded(command: Callable) -> Callable:
    """Run a command so that bad input that escaped its own checks still exits 2 in one line, and
    anything else unexpected exits 1 as a bug, never as a traceback posing as bad input."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, ClickException):
            raise
        except ConfigError as exc:
            fail(str(exc))
        except KeyboardInterrupt:   # typer would exit 130 without a word, once the command has cleaned up
            Console(stderr=True).print("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 (the one place every other failure is reported)
            bug(exc)
    return run


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM ends the command as Ctrl-C does, through every `finally` (servers stopped, folders
    removed), with the shell's 143; by default it would end the process where it stands."""
    def terminate(signum, frame) -> None:
        Console(stderr=True).print("terminated")
        raise SystemExit(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# The policy names the registry (runs/registry.py) resolves; kept literal so `--help` does not import
# every policy, and checked against the registry by tests/test_cli_help.py.
ADMISSION_FORMS = "misa, misa-goodput or cap<N> (N sessions in flight)"
POLICY_HELP = ("a policy name (e.g. cadence, laminar, areal, least-loaded, cache-aware; an unknown name lists "
               f"them all), ADMISSION+POLICY with ADMISSION {ADMISSION_FORMS}, or a CadenceRL variant file "
               "(benchmarks/variants/*.yaml)")
SeedOpt = typer.Option(None, "--seed", min=0, help="workload seed (default: the scenario's)")
TrajectoriesOpt = typer.Option(None, "--trajectories", min=1,
                               help="trajectories per run; the trainer batch scales with it unless --batch-size")
BatchOpt = typer.Option(None, "--batch-size", min=1,
                        help="trainer batch (default: the scenario's, scaled with --trajectories)")
EtaOpt = typer.Option(None, "--eta", min=0, help="staleness bound (default: the scenario's)")
DeltaOpt = typer.Option(None, "--delta", min=0, help="decode reserve per trajectory, tokens (default: the scenario's)")
TrainerClusterOpt = typer.Option(None, "--trainer-cluster",
                                 help="put the trainer in this cluster of the pool (default: the scenario's)")


RayOpt = typer.Option(None, "--ray", help="run the simulations on the Ray cluster at ADDRESS ('auto': the one "
                      "this machine is attached to) instead of local processes; the results are the same")
JobsOpt = typer.Option(None, "--jobs", min=1, max=256, help="simulations run in parallel on local processes "
                       "(default: the CPU count)")


def fanout_from(jobs: Optional[int], ray: Optional[str]):
    """Where a command's independent simulations run: the Ray cluster at `ray`, else `jobs` local processes."""
    from cadencerl.runs.fanout import Fanout

    return Fanout(ray_address=ray) if ray else Fanout.local(jobs)


def load_scenario(name: Optional[str], config: Optional[Path], overrides: dict,
                  json_out: Optional[str] = None) -> Scenario:
    """The scenario named by exactly one of --scenario / --config, with the command-line overrides
    applied, after checking that `--json` (if given) can be written; bad input exits naming it."""
    try:
        scenario = build_scenario(name, config, overrides)
    except ConfigError as exc:
        fail(str(exc))
    trace = scenario.workload.trace
    check_json_target(json_out, config, Path(trace) if trace is not None else None)
    return scenario


def build_scenario(name: Optional[str], config: Optional[Path], overrides: dict) -> Scenario:
    """The scenario as the CLI builds it from its options (benchmark scripts share it); raises
    ConfigError naming the field.

    `--trajectories N` scales the trainer batch with it, so the run keeps the scenario's number of
    batches (the same regime, smaller); `--batch-size B` sets the batch instead."""
    if (name is None) == (config is None):
        raise ConfigError("scenario: give exactly one of --scenario NAME or --config FILE")
    s = builtin_scenario(name) if name is not None else load_scenario_file(config)
    trajectories, batch = overrides.get("trajectories"), overrides.get("batch_size")
    if trajectories is not None:
        s = s.resized(trajectories, batch)
    elif batch is not None:
        s = s.with_overrides(trainer={"batch_size": batch})
    s = s.with_knobs(**{k: overrides[k] for k in ("eta", "delta") if overrides.get(k) is not None})
    changes: dict = {}
    if overrides.get("seed") is not None:
        changes["seed"] = overrides["seed"]
    if overrides.get("trainer_cluster") is not None:
        changes["trainer"] = {"cluster": overrides["trainer_cluster"]}
    return s.with_overrides(**changes) if changes else s


def scenario_from_options(options: object) -> Scenario:
    """`build_scenario` from a benchmark script's parsed options (`scenario`, `config` and the
    overrides `compare` takes), so each script builds the scenario `compare` would."""
    overrides = {k: getattr(options, k, None) for k in ("seed", "trajectories", "batch_size", "eta", "delta",
                                                        "trainer_cluster")}
    config = getattr(options, "config", None)
    return build_scenario(getattr(options, "scenario", None), Path(config) if config else None, overrides)


def check_json_target(target: Optional[str], config: Optional[Path] = None, trace: Optional[Path] = None) -> None:
    """Before any work: `--json PATH` can be written, and is none of the files the run reads (the
    scenario file, its trace). Nothing is created here: missing folders are made when it is written."""
    if target is None or target == "-":
        return
    path = Path(target)
    if path.is_dir():
        fail(f"--json: {target!r} is a directory; give a file path")
    if path.exists() and not path.is_file():       # /dev/null, /dev/stdout, a FIFO: written to as it is
        if not os.access(path, os.W_OK):
            fail(f"--json: cannot write to {target!r}: permission denied")
        return
    for what, read in (("the --config file", config), ("the scenario's workload.trace", trace)):
        if read is not None and path.exists() and read.exists() and path.resolve() == read.resolve():
            fail(f"--json: {target!r} is {what}; give another path")
    folder = path.resolve().parent
    while not folder.exists():          # the nearest folder that exists is where the rest is made
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{str(folder)!r} is not a folder")
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        fail(f"--json: cannot write to {target!r}: {exc.strerror or exc}")


def write_json(target: Optional[str], payload) -> None:
    """Write `payload` to the file `target` (whole or not at all), or to stdout when it is '-'."""
    if target is None:
        return
    text = json.dumps(payload, indent=2)
    if target == "-":
        sys.stdout.write(text + "\n")
    else:
        write_atomic(Path(target), text + "\n")


def int_list(name: str, text: str, minimum: int = 0) -> list[int]:
    """A comma-separated list of distinct integers >= `minimum`, or a one-line error naming the option."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        fail(f"{name}: expected comma-separated integers >= {minimum}, got {text!r}")
    return distinct(name, values)


def distinct(name: str, values: list) -> list:
    """`values`, or a one-line error naming the option when one is given twice (it would run twice)."""
    twice = sorted({str(v) for v in values if values.count(v) > 1})
    if twice:
        fail(f"{name}: duplicate {', '.join(twice)}; give each once")
    return values
