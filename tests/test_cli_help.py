"""`--help` describes every option, the same option alike in every command, and the policy forms
the registry accepts."""

import re

import pytest
import typer.main
from typer.testing import CliRunner

from cadencerl.cli.common import ADMISSION_FORMS, POLICY_HELP, DeltaOpt, EtaOpt, SeedOpt, TrajectoriesOpt
from cadencerl.cli.main import app

runner = CliRunner()


def commands(group, path=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def flat(text: str) -> str:
    """Help text with click's line wrapping undone (it also breaks after a hyphen)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def test_every_option_has_help():
    bare = [(" ".join(path), p.opts[0]) for path, command in commands(typer.main.get_command(app))
            for p in command.params if p.param_type_name == "option" and not p.help]
    assert not bare, bare


@pytest.mark.parametrize("command", ["sim", "compare", "run"])
@pytest.mark.parametrize("option", [TrajectoriesOpt, SeedOpt, EtaOpt, DeltaOpt],
                         ids=["trajectories", "seed", "eta", "delta"])
def test_run_describes_its_numbers_as_sim_does(command, option):
    shown = flat(runner.invoke(app, [command, "--help"]).output)
    assert f"{option.param_decls[0]} <int range> {flat(option.help)} [x>={option.min}]" in shown, shown


def test_the_policy_help_names_what_the_registry_accepts():
    from cadencerl.runs.registry import ADMISSIONS, FACTORIES

    examples = re.search(r"\(e\.g\. ([^;]+);", POLICY_HELP).group(1).split(", ")
    assert set(examples) <= set(FACTORIES)
    assert all(a in ADMISSION_FORMS for a in ADMISSIONS) and "cap<N>" in ADMISSION_FORMS
    shown = flat(runner.invoke(app, ["compare", "--help"]).output)
    assert flat(POLICY_HELP) in shown


def test_report_states_its_smallest_trajectories():
    """At least one trajectory per batch of the 16 iterations every report run lasts."""
    assert "[x>=16]" in flat(runner.invoke(app, ["report", "--help"]).output)
    result = runner.invoke(app, ["report", "--out", "unused", "--trajectories", "15"])
    assert result.exit_code == 2 and "--trajectories" in result.output and "equal to 16" in result.output


def test_version_prints_the_installed_packages_version():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"cadencerl {version('cadencerl')}"
