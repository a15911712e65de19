"""`cadencerl run`'s options for weights, metrics and Ray: bad input is one line naming the field."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("args, field", [
    (["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:1", "--metrics-port", "70000"], "metrics_port"),
    (["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:1", "--weights", "/nonexistent"], "weights"),
    (["run", "-s", "cpu-pair", "--ray", "auto", "--local", "2"], "workers"),
    (["pool", "up", "--ray", "auto"], "scenario"),
])
def test_bad_input_is_one_line_naming_the_field(args: list[str], field: str) -> None:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0], r.output
