"""`cadencerl router`: bad input is one line naming the field, and exit code 2 (nothing is served)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app

pytestmark = pytest.mark.timeout(60)
runner = CliRunner()


@pytest.mark.parametrize("args, field", [
    (["--workers", "gpu0:8000"], "workers"),
    (["--workers", "http://a:1,http://a:1"], "workers"),
    (["--workers", "http://127.0.0.1:99999"], "workers"),
    (["--workers", "http://127.0.0.1:0"], "workers"),
    (["--workers", "http://127.0.0.1:80x"], "workers"),
    (["--workers", "http://:80"], "workers"),
    (["--workers", "http://a:1", "--policy", "misa+cadence"], "policy"),
    (["--workers", "http://a:1", "--port", "70000"], "port"),
    (["--workers", "http://a:1", "--cache-threshold", "1.5"], "cache_threshold"),
    (["--workers", "http://a:1", "--hold-timeout", "0"], "hold_timeout_s"),
    (["--workers", "http://a:1", "--classes", "no/such.yaml"], "classes"),
])
def test_bad_router_input_names_the_field(args: list[str], field: str) -> None:
    result = runner.invoke(app, ["router", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and f"error: {field}" in lines[0], result.output
    if field == "workers":
        assert "--workers" in lines[0] or "twice" in lines[0]


def test_a_bad_classes_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "classes.yaml"
    path.write_text("agent: 1\nrlvr: -2\n")
    result = runner.invoke(app, ["router", "--workers", "http://a:1", "--classes", str(path)])
    assert result.exit_code == 2 and "classes: share of 'rlvr'" in result.output
    result = runner.invoke(app, ["router", "--workers", "http://a:1", "--classes", str(path),
                                 "--config", str(path)])
    assert result.exit_code == 2 and "classes: give --classes or --config" in result.output
