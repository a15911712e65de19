"""`--ray ADDRESS`: the simulations of plan and sensitivity on a local Ray cluster of two nodes give
what the same jobs give here (runs/fanout.py). Bounded in time; every Ray process is gone after."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadencerl.cli.main import app
from cadencerl.runs import plan
from cadencerl.runs.fanout import Fanout
from tests.conftest import small

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(400)
STORE = 80 * 2**20     # the smallest object store Ray accepts


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-")
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_TMPDIR", temp)      # sockets under a short path; the current-cluster file too
    Path(temp, "ray").mkdir()
    c = Cluster()
    try:
        c.add_node(num_cpus=1, include_dashboard=False, object_store_memory=STORE, temp_dir=str(Path(temp, "ray")))
        c.add_node(num_cpus=1, object_store_memory=STORE)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        mp.undo()
        shutil.rmtree(temp, ignore_errors=True)


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rows]


def test_ray_fanout_equals_local_and_uses_both_nodes(cluster) -> None:
    s = small("16a16b8h", trajectories=192, batch=48)
    jobs = [(s.with_knobs(eta=e), "cadence") for e in (1, 2, 3, 4)]
    seen: list[int] = []
    on_ray = Fanout(ray_address=cluster.address).map(plan.evaluate, jobs, lambda done, total: seen.append(done))
    assert strip(on_ray) == strip(Fanout(1).map(plan.evaluate, jobs))
    assert seen == [1, 2, 3, 4]
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    assert all(r["trajectories"] == 192 for r in on_ray)      # conservation: each run completed every trajectory


def test_plan_and_sensitivity_cli_on_ray_equal_local(cluster, tmp_path) -> None:
    runner = CliRunner()
    common = ["-s", "16a16b8h", "--trajectories", "256", "--batch-size", "64"]
    for cmd in (["plan", "--candidates", "H800:0,4;A910X:0,16", "--etas", "1"],
                ["sensitivity", "--etas", "1,2", "--deltas", "1024"]):
        out = {}
        for where, extra in (("local", ["--jobs", "1"]), ("ray", ["--ray", cluster.address])):
            path = tmp_path / f"{cmd[0]}-{where}.json"
            r = runner.invoke(app, [*cmd, *common, *extra, "--json", str(path)])
            assert r.exit_code == 0, r.output
            out[where] = json.loads(path.read_text())
        if cmd[0] == "plan":
            assert out["ray"]["runs"] == out["local"]["runs"] and out["ray"]["best"] == out["local"]["best"]
        else:
            assert strip(out["ray"]) == strip(out["local"])


def test_unreachable_ray_is_one_line() -> None:
    r = CliRunner().invoke(app, ["sensitivity", "-s", "16a16b8h", "--trajectories", "64", "--etas", "1",
                                 "--deltas", "1024", "--ray", "127.0.0.1:1"])
    assert r.exit_code == 2 and r.output.startswith("error: ray:") and r.output.strip().count("\n") == 0
