"""The compiled simulator (`make native`) gives the plain-Python one's results, and a compiled copy
older than its source is never run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cadencerl import native
from cadencerl.config import builtin_scenario
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate

BUILT = pytest.mark.skipif(not native.compiled(), reason="`make native` has not compiled the simulator here")
SMALL = {"workload": {"trajectories": 512}, "trainer": {"batch_size": 128}}

RUN = """
import json, sys
from cadencerl import native
from cadencerl.config import builtin_scenario
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate
name, policy, exact, small = sys.argv[1], sys.argv[2], sys.argv[3] == "exact", json.loads(sys.argv[4])
s = builtin_scenario(name).with_overrides(**small)
r = simulate(s, make_policy(policy, s), exact=exact)
print(json.dumps({"compiled": native.compiled(), "result": {k: v for k, v in r.items() if k != "wall_time_s"}}))
"""


def run_elsewhere(name: str, policy: str, exact: bool, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, name, policy, "exact" if exact else "closed", json.dumps(SMALL)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, **env}, check=True)
    return json.loads(out.stdout)


def test_a_changed_source_is_stale_and_its_recorded_one_is_not() -> None:
    recorded = {m: native.digest(native.source(m)) for m in native.MODULES}
    assert native.stale(recorded) == []
    assert native.stale({**recorded, "cadencerl.sim.engine": "0" * 64}) == ["cadencerl.sim.engine"]
    assert native.stale({}) == list(native.MODULES)


@BUILT
@pytest.mark.parametrize(("name", "policy", "exact"), [("16a16b8h", "cadence", False), ("16a16b8h", "areal", True),
                                                       ("mixed-16a8h", "misa+cadence", False)])
def test_compiled_and_plain_python_give_the_same_run(name: str, policy: str, exact: bool) -> None:
    """Every figure of the run, to the last digit (the wall time aside)."""
    s = builtin_scenario(name).with_overrides(**SMALL)
    r = simulate(s, make_policy(policy, s), exact=exact)
    here = json.loads(json.dumps({k: v for k, v in r.items() if k != "wall_time_s"}))   # as the other side sends it
    pure = run_elsewhere(name, policy, exact, **{native.PURE_ENV: "1"})
    assert pure["compiled"] is False
    assert pure["result"] == here


@BUILT
def test_a_compiled_copy_older_than_its_source_is_not_run(tmp_path: Path) -> None:
    copy = tmp_path / "cadencerl"
    shutil.copytree(native.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    probe = [sys.executable, "-c", "from cadencerl import native; print(native.compiled())"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    fresh = subprocess.run(probe, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=True)
    assert fresh.stdout.strip() == "True" and fresh.stderr == ""
    with open(copy / "sim" / "engine.py", "a") as f:
        f.write("# edited after the build\n")
    edited = subprocess.run(probe, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=True)
    assert edited.stdout.strip() == "False"
    assert "cadencerl/sim/engine.py changed since `make native`" in edited.stderr
