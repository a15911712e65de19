"""Ray-launched servers on a local Ray cluster of two simulated nodes, one per accelerator type.

The head node has one CPU and the `cpu-fast` resource, the other node one CPU and `cpu-slow`: the
pool of `cpu-hetero` must land one server on each, by type. Mid-run the `cpu-slow` node is removed
(its actor and, with it, its vLLM server die): the controller loses that worker and every trajectory
completes on the survivor. Every Ray process and server is gone when the test ends.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cadencerl.api import RolloutPool
from cadencerl.config import builtin_scenario
from cadencerl.devpool.processes import group_members
from cadencerl.devpool.ray_pool import RayPool, accelerator_resource, attach, discover
from cadencerl.devpool.server_env import RPC_PREFIX
from cadencerl.devpool.server_specs import server_specs

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
STORE = 80 * 2**20     # the smallest object store Ray accepts: these tests move no objects


@pytest.fixture
def cluster(require_vllm: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, object]]:
    """Ray's files (sessions, and the current-cluster address it writes to $RAY_TMPDIR/ray whatever
    temp_dir says) go to a short temporary folder (socket paths must stay short), removed after."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-")
    monkeypatch.setenv("RAY_TMPDIR", temp)
    Path(temp, "ray").mkdir()
    c = Cluster()
    try:
        c.add_node(num_cpus=1, resources={accelerator_resource("cpu-fast"): 1}, include_dashboard=False,
                   object_store_memory=STORE, temp_dir=str(Path(temp, "ray")))     # the head
        node = c.add_node(num_cpus=1, resources={accelerator_resource("cpu-slow"): 1}, object_store_memory=STORE)
        yield c, node
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def wait_gone(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(group_members(p) for p in pids):
        time.sleep(0.5)
    return [p for p in pids if group_members(p)]


def describe(pgids: list[int]) -> str:
    """What is left of these process groups (pid, parent, state, command), for a failure message."""
    lines = []
    for pgid in pgids:
        for pid in group_members(pgid):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            lines.append(f"pid {pid} (group {pgid}) parent {stat[1]} state {stat[0]}: {cmd[:160]}")
    return "\n".join(lines)


def test_pool_by_type_on_two_nodes_survives_a_lost_node(cluster: tuple, tiny_model_dir: Path, tmp_path: Path) -> None:
    c, slow_node = cluster
    s = builtin_scenario("cpu-hetero").with_overrides(
        workload={"trajectories": 48, "response": {"median": 64, "sigma": 1.0, "cap": 480}},
        trainer={"batch_size": 12})
    pool = RayPool(server_specs(s), model_dir=tiny_model_dir, address=c.address, start_timeout_s=300,
                   state_root=tmp_path)
    pids: list[int] = []
    socket_dirs = set(Path(tempfile.gettempdir()).glob(f"{RPC_PREFIX}*"))
    try:
        servers = pool.up()
        pids = [x.pid for x in servers]
        assert [x.accelerator for x in servers] == ["cpu-fast", "cpu-slow"]
        assert servers[1].node_id == slow_node.node_id != servers[0].node_id    # placed by type
        assert discover(c.address) == ["cadencerl-vllm-0", "cadencerl-vllm-1"]
        assert attach(["cadencerl-vllm-1"], c.address) == [servers[1].url]      # by actor name

        removed = threading.Event()

        def lose_the_slow_node(done: int, _total: int) -> None:
            if done >= 8 and not removed.is_set():
                removed.set()
                threading.Thread(target=c.remove_node, args=(slow_node,), daemon=True).start()

        with RolloutPool.from_scenario(s, pool.urls, kv_tokens=[1536, 3072], deadline_s=400,
                                       progress=lose_the_slow_node) as rollout:
            for batch in rollout.batches():
                assert max(batch.staleness()) <= s.controller.eta
                rollout.publish()
            result = rollout.result()
            assert rollout.backend.verify() == []
        assert removed.is_set()
        assert result["trajectories_completed"] == 48
        assert result["lost_workers"] == [1] and [w["alive"] for w in result["workers"]] == [True, False]
        assert pool.alive(timeout_s=5) == [True, False]
        # The server gets SIGTERM when its actor dies (PR_SET_PDEATHSIG) and then shuts vLLM down
        # gracefully; on a starved CI machine that took over 60 s once, so it is given 180 s and a
        # failure names what is left.
        left = wait_gone(pids[1:], timeout_s=180)
        assert left == [], f"the lost node's server outlived its actor:\n{describe(left)}"
        assert len(new_socket_dirs(socket_dirs)) == 1, "the lost server left its socket folder behind"
    finally:
        pool.down()
        left = wait_gone(pids)
    assert left == [], f"servers still running after down: {left}"
    assert new_socket_dirs(socket_dirs) == set()
    assert discover(c.address) == []


def new_socket_dirs(before: set[Path]) -> set[Path]:
    """The servers' socket folders (`server_env`) made since `before` and still there."""
    return set(Path(tempfile.gettempdir()).glob(f"{RPC_PREFIX}*")) - before
