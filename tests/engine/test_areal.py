"""AReaL's own rollout client through `cadencerl router --policy cadence` over two vLLM CPU servers.

AReaL 1.0.4's `RemotevLLMEngine` and `WorkflowExecutor` (its `StalenessManager` pacing episodes)
run unchanged in a process of their own (`areal_client.py`, under vLLM's interpreter with the
`areal` extra that `make test` installs into .venv-areal). A batch of single-turn and multi-turn
episodes, a pause + weight update from disk mid-rollout: every episode completes once with its
exact lengths, its version segments recorded, none consumed staler than eta; every request the
router handed back ("abort") was re-sent and resumed; the router's books balance.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cadencerl.devpool.local_pool import LocalPool, vllm_python
from cadencerl.devpool.weights import WeightPusher, WeightVersions
from cadencerl.engine.server_metrics import series_total

pytestmark = [pytest.mark.engine, pytest.mark.timeout(420)]

AREAL_PATH_ENV = "CADENCERL_AREAL_PATH"      # the folder `make test` installs the areal extra into
CLIENT = Path(__file__).with_name("areal_client.py")
SCENARIO = Path(__file__).resolve().parents[2] / "cadencerl" / "scenarios" / "cpu-hetero.yaml"
EPISODES, BATCH, ETA = 24, 8, 1


@pytest.fixture(scope="module")
def areal_path() -> str:
    path = os.environ.get(AREAL_PATH_ENV)
    if not path or not (Path(path) / "areal").is_dir():
        pytest.skip(f"AReaL is not installed: set {AREAL_PATH_ENV} to the folder `make test` installs it into "
                    "(.venv-areal)")
    return path


def test_areal_client_through_the_router(engine_pool: LocalPool, areal_path: str, tiny_model_dir: Path,
                                         tmp_path: Path) -> None:
    versions = WeightVersions(tiny_model_dir, tmp_path / "versions")
    weights = versions.path(1)
    router = subprocess.Popen([sys.executable, "-m", "cadencerl.cli", "router", "--workers", ",".join(engine_pool.urls),
                               "--policy", "cadence", "--config", str(SCENARIO), "--port", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = router.stderr.readline()
        address = re.search(r"listening on http://(127\.0\.0\.1:\d+)", line)
        assert address, line
        out = tmp_path / "result.json"
        env = {**os.environ, "PYTHONPATH": areal_path, "PYTHONWARNINGS": "ignore"}
        client = subprocess.run([vllm_python(), str(CLIENT), "--addr", address.group(1), "--weights", str(weights),
                                 "--out", str(out), "--scratch", str(tmp_path), "--episodes", str(EPISODES),
                                 "--batch", str(BATCH), "--eta", str(ETA)],
                                env=env, capture_output=True, text=True, timeout=360)
        metrics = httpx.get(f"http://{address.group(1)}/metrics", timeout=10).text
        output = client.stdout + client.stderr               # AReaL logs (a failed workflow's too) to stdout
        assert client.returncode == 0 and "Traceback" not in output, router_view(metrics) + client_view(output)
    finally:
        router.terminate()
        router.wait(timeout=20)
        push = WeightPusher(versions)         # the shared pool goes back to the base weights
        for index, url in enumerate(engine_pool.urls):
            push(index, url, 0)
        push.close()
    result = json.loads(out.read_text())
    spec = {d["id"]: d for d in result["spec"]}
    got = {int(k): v for k, v in result["episodes"].items()}
    assert sorted(got) == sorted(spec)                                    # every episode, once
    consumed = [e for _, ids in result["consumed"] for e in ids]
    assert sorted(consumed) == sorted(spec)                               # and trained on once
    for eid, episode in got.items():
        turns = episode["turns"]
        assert [t["tokens"] for t in turns] == spec[eid]["replies"], eid   # exact lengths, resumed or not
        assert all(t["stop"] == "length" and len(t["versions"]) == t["tokens"] for t in turns)
    when = {e: version for version, ids in result["consumed"] for e in ids}
    first = {eid: min(v for t in ep["turns"] for v in t["versions"]) for eid, ep in got.items()}
    assert all(when[e] - first[e] <= ETA for e in got)                    # none staler than eta
    segments = {eid: [v for t in ep["turns"] for v in t["versions"]] for eid, ep in got.items()}
    assert {v for versions in segments.values() for v in versions} == {0, 1}   # both versions served
    assert all(versions == sorted(versions) for versions in segments.values())  # an episode's segments in order
    # (Whether an episode spans the update is AReaL's timing: it tags tokens by its version when the
    # reply arrives, and a handed-back request may have had no token yet. Counted, not required.)
    spanning = sum(len(set(versions)) > 1 for versions in segments.values())
    handed_back = series_total(metrics, "cadencerl_router_handed_back_total")
    resumed = series_total(metrics, "cadencerl_router_resumed_total")
    assert handed_back >= 1 and resumed == handed_back                    # each abort was resumed
    # Behind AReaL's own pacing, with KV not binding, nothing waits out --hold-timeout (a 429 here
    # would be retried by AReaL, and hidden, but for this check).
    assert series_total(metrics, "cadencerl_router_rejections_total") == 0, router_view(metrics)
    requests = sum(len(d["replies"]) for d in spec.values())
    assert series_total(metrics, "cadencerl_router_completed_sessions") == requests   # the router's books balance
    assert series_total(metrics, "cadencerl_router_weight_version") == len(result["updates_s"]) == 1
    evicted = series_total(metrics, "cadencerl_router_handed_back_total", why="evicted")
    print(f"areal through cadence: {EPISODES} episodes in {result['wall_s']:.1f} s, update {result['updates_s'][0]:.2f} s, "
          f"{spanning} spanning it, handed back {handed_back:.0f} (policy evictions "
          f"{evicted:.0f}), resumed {resumed:.0f}")


def router_view(metrics: str) -> str:
    """What the router did, for a failure's message: its refusals by reason and its resume books."""
    lines = [line for line in metrics.splitlines() if not line.startswith("#") and any(
        name in line for name in ("rejections_total", "handed_back_total", "resumed_total", "hold_depth",
                                  "parked_sessions", "completed_sessions", "requests_total"))]
    return "router:\n" + "\n".join(lines) + "\nclient:\n"


def client_view(output: str) -> str:
    """AReaL's warnings and errors (a refused request's attempts, a failed workflow), a line each."""
    lines = [line[:300] for line in output.splitlines() if "WARNING" in line or "ERROR" in line or "Error" in line]
    return "\n".join(lines[-40:])
