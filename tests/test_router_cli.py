"""`cadencerl router`: bad input is one line naming the field, and exit code 2 (nothing is served)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
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
    (["--workers", "http://a:1", "--policy", "no-such-policy"], "policy"),
    (["--workers", "http://a:1", "--policy", "sync"], "policy"),          # batch-paced: no live form
    (["--workers", "http://a:1", "--port", "70000"], "port"),
    (["--workers", "http://a:1", "--cache-threshold", "1.5"], "cache_threshold"),
    (["--workers", "http://a:1", "--hold-timeout", "0"], "hold_timeout_s"),
    (["--workers", "http://a:1", "--max-response-ids", "0"], "max_response_ids"),
    (["--workers", "http://a:1", "--max-response-ids", "-5"], "max_response_ids"),
    (["--workers", "http://a:1", "--classes", "no/such.yaml"], "classes"),
    (["--workers", "http://a:1", "--max-sessions", "0"], "max_sessions"),
    (["--workers", "http://a:1", "--request-timeout-secs", "-1"], "request_timeout_s"),
    (["--workers", "http://a:1", "--poll-interval-secs", "0"], "metrics_interval_s"),
    (["--workers", "http://a:1", "--hold-timeout", "inf"], "hold_timeout_s"),      # a Retry-After of inf
    (["--workers", "http://a:1", "--poll-interval-secs", "nan"], "metrics_interval_s"),
    (["--workers", "http://a:1", "--balance-rel-threshold", "inf"], "balance_rel_threshold"),
])
def test_bad_router_input_names_the_field(args: list[str], field: str) -> None:
    result = runner.invoke(app, ["router", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and f"error: {field}" in lines[0], result.output
    flag = args[-2]
    if flag not in ("--workers", "--classes"):          # and the flag, where it has another name
        named = field if flag == "--" + field.replace("_", "-") else f"{field} ({flag})"
        assert f"error: {named}: " in lines[0], result.output
    if field == "workers":
        assert "--workers" in lines[0] or "twice" in lines[0]


@pytest.mark.parametrize("share", ["-2", ".nan", ".inf", "true", "'x'"])
def test_a_bad_classes_file_names_the_field(tmp_path: Path, share: str) -> None:
    path = tmp_path / "classes.yaml"
    path.write_text(f"agent: 1\nrlvr: {share}\n")
    result = runner.invoke(app, ["router", "--workers", "http://a:1", "--classes", str(path)])
    assert result.exit_code == 2 and "classes: share of 'rlvr' must be a positive number" in result.output
    result = runner.invoke(app, ["router", "--workers", "http://a:1", "--classes", str(tmp_path)])
    assert result.exit_code == 2 and "is not a file" in result.output
    result = runner.invoke(app, ["router", "--workers", "http://a:1", "--classes", str(path),
                                 "--config", str(path)])
    assert result.exit_code == 2 and "classes: give --classes or --config" in result.output


def one_error_line(args: list[str]) -> str:
    result = runner.invoke(app, ["router", "--workers", "http://127.0.0.1:9", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def test_a_host_that_does_not_resolve_names_the_host() -> None:
    assert one_error_line(["--host", "999.1.1.1"]).startswith("error: host: cannot resolve '999.1.1.1'")


def test_a_port_in_use_names_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert one_error_line(["--port", str(port)]) == f"error: port: {port} on 127.0.0.1 is already in use"


def test_the_router_says_where_it_listens() -> None:
    """One line on stderr when it starts: address (the real port for --port 0), workers, policy, data path."""
    proc = subprocess.Popen([sys.executable, "-m", "cadencerl.cli", "router", "--workers", "http://127.0.0.1:9",
                             "--port", "0", "--policy", "round-robin"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    match = re.fullmatch(r"router: listening on http://127\.0\.0\.1:(\d+), 1 workers \(http://127\.0\.0\.1:9\), "
                         r"policy round-robin, data path in (Rust|Python)\n", line)
    assert match and int(match.group(1)) > 0, line


@pytest.mark.parametrize("name, text", [("c.TOML", "agent = 1\nrlvr = 3\n"), ("c.Json", '{"agent": 1, "rlvr": 3}')])
def test_a_classes_suffix_in_any_case_picks_the_parser(tmp_path: Path, name: str, text: str) -> None:
    from cadencerl.router.settings import read_classes

    (tmp_path / name).write_text(text)
    shares, default = read_classes(tmp_path / name)
    assert shares == {"agent": 1, "rlvr": 3} and default is None


def test_a_host_that_resolves_to_two_addresses_is_listened_on_at_both(monkeypatch) -> None:
    """`localhost` often resolves to ::1 first: the router must listen on 127.0.0.1 as well, as
    uvicorn's own binding (asyncio's create_server) does, on one port."""
    from cadencerl.router import serve

    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 on this machine")
    both = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
    monkeypatch.setattr(serve.socket, "getaddrinfo", lambda *a, **k: both)
    socks = serve.bind("localhost", 0)
    try:
        assert [s.family for s in socks] == [socket.AF_INET6, socket.AF_INET]
        assert len({s.getsockname()[1] for s in socks}) == 1
        assert socks[0].getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    finally:
        for s in socks:
            s.close()


def test_max_response_ids_reaches_the_router(monkeypatch) -> None:
    """`--max-response-ids` bounds the map of stored responses, as `max_response_ids` does."""
    from cadencerl.router import serve

    served = []
    monkeypatch.setattr(serve, "bind", lambda host, port, reuse_port=False: [socket.socket()])
    monkeypatch.setattr(serve, "serve", lambda settings, socks: served.append(settings) or socks[0].close())
    result = runner.invoke(app, ["router", "--workers", "http://a:1", "--max-response-ids", "12"])
    assert result.exit_code == 0 and served[0].max_response_ids == 12, result.output
    result = runner.invoke(app, ["router", "--workers", "http://a:1"])
    assert result.exit_code == 0 and served[1].max_response_ids == 65536, result.output


@pytest.mark.parametrize("flag, value, field", [
    ("--max-sessions", "7", "max_sessions"), ("--request-timeout-secs", "30", "request_timeout_s"),
    ("--max-payload-size", "1024", "max_body_bytes"), ("--eviction-interval-secs", "5", "eviction_interval_s"),
    ("--max-tree-size", "4096", "max_tree_size"), ("--health-failure-threshold", "3", "failures_to_down"),
    ("--poll-interval-secs", "2", "metrics_interval_s"),
])
def test_each_router_setting_has_a_flag_that_reaches_it(monkeypatch, flag: str, value: str, field: str) -> None:
    from cadencerl.router import serve
    from cadencerl.router.settings import RouterSettings

    served = []
    monkeypatch.setattr(serve, "bind", lambda host, port, reuse_port=False: [socket.socket()])
    monkeypatch.setattr(serve, "serve", lambda settings, socks: served.append(settings) or socks[0].close())
    result = runner.invoke(app, ["router", "--workers", "http://a:1", flag, value])
    assert result.exit_code == 0, result.output
    assert getattr(served[0], field) == float(value) != RouterSettings.model_fields[field].default


def test_a_config_that_is_not_a_scenario_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "classes.yaml"
    path.write_text("agent: 1\n")
    assert one_error_line(["--config", str(path)]).startswith("error: --config classes.yaml: ")
