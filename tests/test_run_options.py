"""`cadencerl run`'s options for weights, metrics and Ray: bad input is one line naming the field."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app
from cadencerl.devpool.local_pool import LocalPool, PoolConfig, PoolState, SpawnedServer
from cadencerl.devpool.processes import start_ticks
from cadencerl.devpool.server_env import new_rpc_dir, remove_rpc_dir, server_env

pytestmark = pytest.mark.timeout(60)
NEEDS_RAY = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed "
                               "(`make test` installs it): without it every --ray run stops at 'Ray is not installed'")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, field", [
    (["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:1", "--metrics-port", "70000"], "metrics_port"),
    (["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:1", "--weights", "/nonexistent"], "weights"),
    (["run", "-s", "cpu-pair", "--ray", "auto", "--local", "2"], "workers"),
    (["pool", "up", "--ray", "auto"], "scenario"),
    # an empty list was taken for 'not given': 'no server actors in the cluster; start them with pool up'
    (["run", "-s", "cpu-hetero", "--ray", "auto", "--ray-actors", " , "], "ray_actors: give actor names"),
    # with --workers the actors were silently not the servers the run used
    (["run", "-s", "cpu-hetero", "--workers", "http://127.0.0.1:1", "--ray-actors", "a,b"], "ray_actors: "),
    # an address nothing listens at: Ray's own connect retried for ~13 minutes, printing warnings
    pytest.param(["run", "-s", "cpu-hetero", "--ray", f"127.0.0.1:{_closed_port()}"], "ray: no Ray cluster answers",
                 marks=NEEDS_RAY),
    pytest.param(["pool", "down", "--ray", f"localhost:{_closed_port()}"], "ray: no Ray cluster answers",
                 marks=NEEDS_RAY),
    (["calibrate", "--workers", "http://127.0.0.1:1", "--batches", "1", "--prompts", "32,64"], "batches: "),
    (["pool", "up", "--workers", "1", "--state-dir", __file__], "state_dir: "),
    (["pool", "down", "--state-dir", __file__], "state_dir: "),
    (["pool", "up", "--workers", "1", "--state-dir", "/proc/no-such-pool"], "state_dir: cannot write"),
    # the scenario sizes its servers: the flags were silently ignored
    (["pool", "up", "-s", "cpu-pair", "--workers", "3", "--dtype", "float32"], "workers: the scenario sizes"),
    # vLLM refused it after a start-up, in a message that lost its cause
    (["pool", "up", "--workers", "1", "--kv-tokens", "10"], "kv_tokens: worker 0 has 32; a server needs at least 64"),
])
def test_bad_input_is_one_line_naming_the_field(args: list[str], field: str) -> None:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0], r.output


def test_pool_up_refuses_a_state_dir_whose_servers_still_run(tmp_path, monkeypatch) -> None:
    """A second `pool up` in the same state dir stopped the running servers without a word (and
    with them every run using them); it now says so and leaves them alone."""
    monkeypatch.setenv("CADENCERL_VLLM_PYTHON", "/bin/false")     # nothing may start here
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        PoolState(model_dir=str(tmp_path), servers=[SpawnedServer(0, "http://127.0.0.1:1", 1, server.pid,
                                                                   start_ticks(server.pid) or 0, 0, 8192, "log")]
                  ).write(tmp_path)
        r = CliRunner().invoke(app, ["pool", "up", "--workers", "1", "--state-dir", str(tmp_path)])
        assert r.exit_code == 2 and r.output.startswith("error: state_dir:") and "pool down" in r.output, r.output
        assert server.poll() is None                                   # still running
    finally:
        server.kill()
        server.wait()
    r = CliRunner().invoke(app, ["pool", "up", "--workers", "1", "--state-dir", str(tmp_path)])
    assert "state_dir" not in r.output                                 # a dead pool's state is leftovers


@pytest.mark.parametrize("text", ["{bad json", '{"servers": [{"pid": 1}]}'])
def test_a_state_file_that_is_not_a_pool_s_is_named_not_a_bug(tmp_path, text: str) -> None:
    (tmp_path / "pool.json").write_text(text)
    for args in (["pool", "down"], ["pool", "up", "--workers", "1"]):
        r = CliRunner().invoke(app, [*args, "--state-dir", str(tmp_path)])
        assert r.exit_code == 2 and r.output.startswith("error: state_dir: ") and "pool.json" in r.output, r.output


def test_a_ray_pool_error_is_said_once_under_ray(monkeypatch) -> None:
    """The pool's errors start with 'ray: ' already: the CLI printed 'ray: ray: Failed to look up ...'."""
    pytest.importorskip("ray")
    from cadencerl.devpool import ray_pool
    from cadencerl.devpool.local_pool import PoolError

    def attach(names, address=None):
        raise PoolError(f"ray: Failed to look up actor with name '{names[0]}'.")

    monkeypatch.setattr(ray_pool, "attach", attach)
    r = CliRunner().invoke(app, ["run", "-s", "cpu-hetero", "--ray", "auto", "--ray-actors", "my-engine-0"])
    assert r.exit_code == 2 and r.output.strip() == "error: ray: Failed to look up actor with name 'my-engine-0'."


def test_an_actor_that_is_not_there_is_named_under_ray_actors(monkeypatch) -> None:
    """Ray's own message ("This could because 1. You are trying to look up a named actor you
    didn't create. 2. ...") named neither the actor's flag nor the actor plainly."""
    pytest.importorskip("ray")
    import ray

    from cadencerl.devpool import ray_pool

    def get_actor(name, namespace=None):
        raise ValueError(f"Failed to look up actor with name '{name}'. This could because 1. ...")

    monkeypatch.setattr(ray_pool, "connect", lambda address, namespace=None: None)
    monkeypatch.setattr(ray, "get_actor", get_actor)
    r = CliRunner().invoke(app, ["run", "-s", "cpu-hetero", "--ray", "auto", "--ray-actors", "nosuch-0,nosuch-1"])
    assert r.exit_code == 2 and r.output.strip() == ("error: ray_actors: no actor named 'nosuch-0' in the "
                                                     "cluster's namespace 'cadencerl'"), r.output


def test_a_second_ray_pool_up_leaves_the_running_pool_alone(monkeypatch, tmp_path) -> None:
    """It failed on the taken placement-group name, and its clean-up removed the running pool's
    servers too (every run on them lost its workers)."""
    pytest.importorskip("ray")
    from cadencerl.devpool import ray_pool
    from cadencerl.devpool.local_pool import PoolError
    from cadencerl.devpool.server_specs import ServerSpec

    removed = []
    monkeypatch.setattr(ray_pool, "connect", lambda address, namespace=None: None)
    monkeypatch.setattr(ray_pool, "discover", lambda *a, **k: ["cadencerl-vllm-0", "cadencerl-vllm-1"])
    monkeypatch.setattr(ray_pool, "down", lambda *a, **k: removed.append(a) or [])
    pool = ray_pool.RayPool([ServerSpec("cpu-fast", 1, 4096, 32)], model_dir=tmp_path, python=sys.executable)
    with pytest.raises(PoolError, match=r"already runs this pool's servers \(cadencerl-vllm-0, cadencerl-vllm-1\)"):
        pool.up()
    assert removed == []


def test_pool_down_counts_only_the_servers_it_stopped_and_removes_their_socket_dirs(tmp_path) -> None:
    """A server that had already died was counted: 'stopped 2 servers' with one running. Each
    server's ZMQ socket files (vLLM leaves them behind, about seven a start) go with it."""
    live, dead = (subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2))
    rpc_dirs = [new_rpc_dir() for _ in range(2)]
    try:
        for d in rpc_dirs:
            (Path(d) / "0f1e2d3c-socket").touch()
        servers = [SpawnedServer(i, f"http://127.0.0.1:{i + 1}", i + 1, p.pid, start_ticks(p.pid) or 0, 0, 8192, "log",
                                 rpc_dirs[i]) for i, p in enumerate((live, dead))]
        dead.kill()
        dead.wait()
        PoolState(model_dir=str(tmp_path), servers=servers).write(tmp_path)
        r = CliRunner().invoke(app, ["pool", "down", "--state-dir", str(tmp_path)])
        assert r.exit_code == 0 and r.output.strip() == "stopped 1 server", r.output
        assert live.wait(timeout=10) is not None and PoolState.read(tmp_path) is None
        assert not any(Path(d).exists() for d in rpc_dirs)
    finally:
        for p in (live, dead):
            p.kill()
            p.wait()
        for d in rpc_dirs:
            shutil.rmtree(d, ignore_errors=True)


FAKE_VLLM_SERVER = """
import os, pathlib, signal, sys
pathlib.Path(os.environ["VLLM_RPC_BASE_PATH"], "0f1e2d3c-socket").touch()
pathlib.Path(os.environ["ARGV_FILE"]).write_text(" ".join(sys.argv[1:]))
def terminated(*_):
    raise KeyboardInterrupt("terminated")       # as vLLM's server turns SIGTERM into its shutdown
if os.environ["LOADED"] == "1":
    signal.signal(signal.SIGTERM, terminated)
os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.parametrize("loaded", [True, False])
def test_a_server_removes_its_socket_dir_as_it_exits_on_sigterm(tmp_path, monkeypatch, loaded: bool) -> None:
    """A server that ends without `down` (its Ray actor lost with its node: SIGTERM from
    PR_SET_PDEATHSIG) left its socket folder in the temp folder for good; it now removes it itself,
    also when SIGTERM comes before vLLM is `loaded` (its handler installed). A stand-in for vLLM's
    server module plays vLLM's part: it binds a socket file and gets SIGTERM."""
    fake = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    fake.mkdir(parents=True)
    for package in (fake, fake.parent, fake.parent.parent):     # regular packages: ahead of an installed vllm
        (package / "__init__.py").touch()
    (fake / "api_server.py").write_text(FAKE_VLLM_SERVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    rpc_dir = new_rpc_dir()
    try:
        env = {**server_env(0, False, rpc_dir), "ARGV_FILE": str(tmp_path / "argv"), "LOADED": str(int(loaded))}
        cmd = [sys.executable, "-m", "cadencerl.devpool.vllm_server", "--model", "m", "--port", "1"]
        r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        if loaded:      # vLLM's shutdown, as a KeyboardInterrupt
            assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr, r.stderr
        else:           # before vLLM's handler: through Python's exit, 128 + SIGTERM
            assert r.returncode == 143, r.stderr
        assert (tmp_path / "argv").read_text() == "--model m --port 1", "vLLM's arguments pass through"
        assert not Path(rpc_dir).exists()
    finally:
        shutil.rmtree(rpc_dir, ignore_errors=True)


def test_only_a_socket_dir_the_pool_made_is_removed(tmp_path) -> None:
    """A hand-edited state file cannot make `down` delete an arbitrary folder."""
    for name in ("keep", "cadencerl-rpc-lookalike"):
        (tmp_path / name).mkdir()
        remove_rpc_dir(str(tmp_path / name))
        assert (tmp_path / name).is_dir()
    remove_rpc_dir("")


def test_a_server_that_fails_to_spawn_leaves_no_socket_dir(tmp_path, monkeypatch) -> None:
    """The socket dir is made before the server's process: when the process cannot start, no state
    file records it, so `down` cannot remove it; the spawn does."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(LocalPool, "_build_model", lambda self: None)
    pool = LocalPool(tmp_path / "state", PoolConfig(num_workers=1, python=str(tmp_path / "no-such-python")))
    with pytest.raises(FileNotFoundError):
        pool.start()
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_a_command_s_local_pool_is_stopped_and_its_folder_removed_when_the_command_is_stopped(
        monkeypatch, stop: str) -> None:
    """SIGTERM (`timeout`, `kill`, a scheduler) left `run --local`'s servers running, in a
    temporary state folder the user was never told of; Ctrl-C stopped them but left the folder."""
    import os
    import signal

    from cadencerl.cli import engine
    from cadencerl.devpool import local_pool as lp

    events, folders = [], []

    class Pool:
        def __init__(self, state, cfg):
            folders.append(Path(state))
            self.servers, self.urls = [], ["http://127.0.0.1:1"]

        def start(self):
            events.append("start")

        def stop(self):
            events.append("stop")

    monkeypatch.setattr(lp, "LocalPool", Pool)
    monkeypatch.setattr(engine, "pin_servers", lambda servers: None)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit if stop == "SIGTERM" else KeyboardInterrupt) as raised:
        with engine.local_pool(PoolConfig(num_workers=1)):
            os.kill(os.getpid(), getattr(signal, stop))
            time.sleep(5)                   # the handler raises in here
    assert events == ["start", "stop"] and not folders[0].exists()
    if stop == "SIGTERM":
        assert raised.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before          # the command's handler is gone with it
